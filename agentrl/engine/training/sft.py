"""Supervised data for the learner: chat conversations as (tokens, loss mask) pairs.

``encode_chat`` renders a conversation with the model's chat template, segment by segment, so
that exactly the assistant turns (their content and end-of-turn token) carry loss mask 1 and the
token boundaries are the ones the generator sees at rollout time (prompt, then each assistant
turn, then the template glue). ``load_conversations`` reads conversations from a JSONL/JSON file
(a ``messages`` field per row, and an optional ``tools`` list of OpenAI function schemas) or from
a ``module:function`` that generates them.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from agentrl.envs.data import parse_json_rows, row_where
from agentrl.errors import DataError

Conversation = list[dict[str, Any]] | dict[str, Any]
"""A list of chat messages, or ``{"messages": [...], "tools": [...]}`` when the conversation was
held with tools (rendered by the chat template's ``tools`` argument, as the gateway renders them)."""

__all__ = ["encode_chat", "load_conversations", "Conversation"]


def encode_chat(tokenizer: Any, conversation: Conversation) -> dict[str, list[int]]:
    """``{"tokens": [...], "loss_mask": [...]}`` for one conversation.

    Loss mask 1 covers each assistant message's content and the end-of-turn (EOS) token that
    closes it; everything else (system, user, tool messages, role headers) is 0. Raises
    DataError if the template is not append-only for this conversation.
    """

    if isinstance(conversation, dict):
        messages, tools = conversation["messages"], conversation.get("tools") or None
    else:
        messages, tools = conversation, None

    def render(msgs: list[dict[str, Any]], gen: bool) -> str:
        if not msgs:
            return ""
        return tokenizer.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=gen)

    def encode(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False)) if text else []

    tokens: list[int] = []
    mask: list[int] = []
    done = ""
    eos = tokenizer.eos_token or ""
    for k, m in enumerate(messages):
        if m.get("role") != "assistant":
            continue
        before = render(messages[:k], True)
        after = render(messages[: k + 1], False)
        if not before.startswith(done) or not after.startswith(before):
            raise DataError(f"conversation is not append-only under the chat template at message {k}")
        ids = encode(before[len(done) :])
        tokens += ids
        mask += [0] * len(ids)
        seg = after[len(before) :]
        cut = seg.find(eos) + len(eos) if eos and eos in seg else len(seg)
        for text, m_ in ((seg[:cut], 1), (seg[cut:], 0)):
            ids = encode(text)
            tokens += ids
            mask += [m_] * len(ids)
        done = after
    if not any(mask):
        raise DataError("conversation has no assistant message to learn from")
    return {"tokens": tokens, "loss_mask": mask}


def load_conversations(source: str, n: int, seed: int = 0) -> list[Conversation]:
    """``n`` conversations from ``source``.

    ``source`` is a ``.jsonl``/``.json`` file whose rows have a ``messages`` list (rows are cycled
    if the file has fewer than ``n``), or ``module:function`` where ``function(n, seed)`` returns
    conversations (e.g. ``agentrl.envs.calc_demos:demonstrations``).
    """
    path = Path(source)
    if path.suffix in (".jsonl", ".json") or path.exists():
        if not path.exists():
            raise DataError(f"{source}: SFT data file not found")
        rows = []
        items, lines = parse_json_rows(path, path.read_text(encoding="utf-8"))
        if not isinstance(items, list):
            raise DataError(f"{source}: expected a list of conversations, got {type(items).__name__}")
        for i, row in enumerate(items):
            where = row_where(source, i, lines)
            msgs = row.get("messages") if isinstance(row, dict) else None
            if not isinstance(msgs, list) or not all(isinstance(m, dict) and "role" in m and "content" in m for m in msgs):
                raise DataError(f"{where}: has no 'messages' list of {{role, content}} objects")
            tools = row.get("tools")
            if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
                raise DataError(f"{where}: has a 'tools' field that is not a list of function schemas")
            rows.append({"messages": msgs, "tools": tools} if tools else msgs)
        if not rows:
            raise DataError(f"{source}: no conversations")
        return [rows[i % len(rows)] for i in range(n)]
    if ":" not in source:
        raise DataError(f"SFT source {source!r}: expected a .jsonl/.json file or module:function")
    module_name, fn_name = source.split(":", 1)
    try:
        fn = getattr(importlib.import_module(module_name), fn_name)
    except (ImportError, AttributeError) as exc:
        raise DataError(f"SFT source {source!r}: cannot import: {exc}") from exc
    try:
        convs = list(fn(n, seed))
    except Exception as exc:  # the user's code: say whose it was, not a traceback
        raise DataError(f"SFT source {source!r} raised {type(exc).__name__}: {exc}") from exc
    if len(convs) != n:
        raise DataError(f"SFT source {source!r} returned {len(convs)} conversations, expected {n}")
    return convs
