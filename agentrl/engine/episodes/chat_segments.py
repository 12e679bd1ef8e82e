"""Token-exact trajectories of an agent's chat calls: what each call showed the model and what it wrote.

An agent program talks to the gateway in messages; the trainer needs tokens. Re-tokenising each
call's messages would train on token sequences the model never produced (a reply's text does not
always tokenise back to the ids that were sampled; templates rewrite history). This module keeps,
per episode, the exact ids instead:

- A call whose messages are an earlier call's messages, plus the reply the model gave there (one of
  its choices), plus new messages **extends** that conversation: the ids already generated are
  kept as they were sampled, and only the new messages' rendering (the *glue*: the end of the
  assistant turn the template adds, the new messages, the next assistant header) is appended.
- Any other call (history rewritten, context compacted, a sub-agent with its own system prompt, a
  second call from the same history while the first is in flight) **starts a segment**: its
  prompt is the chat template's rendering of its messages, which is exactly what the model saw.

At the end, every segment holds prompt ids (loss mask 0), generated ids (mask 1, with their
log-probs and weight versions) and glue (mask 0), and the episode becomes one
:class:`~agentrl.engine.common.trajectory.Trajectory` with one independent sequence per segment.

Messages are compared by role, text content and tool calls (name and parsed arguments); ids,
``refusal``, ``annotations`` and other SDK fields are ignored, so that the SDK's own message object
(``response.choices[0].message``, or its ``model_dump()``) matches the reply it came from.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from agentrl.engine.common.interfaces import Generation
from agentrl.engine.common.trajectory import Trajectory
from agentrl.errors import RequestError

__all__ = ["Call", "ChatRecorder", "Reply", "episode_trajectory", "normalise_messages", "template_message"]

_SENTINEL = "\u2063agentrl-reply\u2063"
"""Stands for the model's reply when the template's glue after it is rendered (never sent to the model)."""


def _text(content: Any, where: str) -> str:
    """The text of a message ``content``: a string, None, or a list of ``{"type": "text"}`` parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise RequestError(f"{where}.content[{i}]: only text parts are supported", f"{where}.content")
            parts.append(part["text"])
        return "".join(parts)
    raise RequestError(f"{where}.content must be a string, null or a list of text parts", f"{where}.content")


def _arguments(raw: Any) -> Any:
    """Tool-call arguments as a JSON value when ``raw`` is a JSON string (as the API sends them)."""
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw
    return raw


def template_message(m: Any, where: str) -> dict[str, Any]:
    """``m`` (an OpenAI chat message: dict or SDK object) as a plain dict for ``apply_chat_template``:
    ``role``, ``content`` (text, or None for an assistant message that only calls tools),
    ``tool_calls`` with ``arguments`` as objects, ``tool_call_id`` and ``name`` where given."""
    if hasattr(m, "model_dump"):
        m = m.model_dump(exclude_none=True)
    if not isinstance(m, dict):
        raise RequestError(f"{where} must be an object", where)
    role = m.get("role")
    if role == "developer":
        role = "system"
    if role not in ("system", "user", "assistant", "tool"):
        raise RequestError(f"{where}.role must be one of system, developer, user, assistant, tool; got {role!r}", f"{where}.role")
    out: dict[str, Any] = {"role": role, "content": _text(m.get("content"), where)}
    calls = m.get("tool_calls") or []
    if calls:
        if role != "assistant" or not isinstance(calls, list):
            raise RequestError(f"{where}.tool_calls must be a list on an assistant message", f"{where}.tool_calls")
        out["tool_calls"] = []
        for i, call in enumerate(calls):
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise RequestError(f"{where}.tool_calls[{i}] needs a function with a name", f"{where}.tool_calls")
            entry = {"type": "function", "function": {"name": fn["name"], "arguments": _arguments(fn.get("arguments", {}))}}
            if call.get("id"):
                entry["id"] = call["id"]
            out["tool_calls"].append(entry)
        if not out["content"]:
            out["content"] = None
    for key in ("tool_call_id", "name"):
        if isinstance(m.get(key), str):
            out[key] = m[key]
    return out


def normalise_messages(messages: Any) -> list[dict[str, Any]]:
    """The request's ``messages`` as template messages; RequestError names the first bad one."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list", "messages")
    return [template_message(m, f"messages[{i}]") for i, m in enumerate(messages)]


def _key(m: dict[str, Any]) -> str:
    """What two messages must share to be the same turn: role, text, tool calls (name, arguments)."""
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in m.get("tool_calls", [])]
    return json.dumps([m["role"], m.get("content") or "", calls], sort_keys=True, ensure_ascii=False)


@dataclass
class Reply:
    """One choice the model gave: the message returned to the agent and the ids behind it."""

    message: dict[str, Any]
    """The assistant message as the agent receives it (template form)."""
    generation: Generation
    """The ids, log-probs and versions sampled."""
    text: str
    """The generated text, decoded with special tokens (what the ids spell)."""
    special_suffix: str
    """The special tokens the generation ended with (EOS), as text; "" when it ended otherwise."""


@dataclass
class _Segment:
    tools_key: str
    messages: list[dict[str, Any]]
    tokens: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    replies: list[Reply] | None = None
    """The newest call's choices, waiting to be continued; None while a call is in flight."""
    tools: list[dict[str, Any]] | None = None

    def extend(self, ids: list[int], m: int, lps: list[float] | None = None, vers: list[int] | None = None) -> None:
        self.tokens.extend(ids)
        self.mask.extend([m] * len(ids))
        self.logprobs.extend(lps if lps is not None else [0.0] * len(ids))
        self.versions.extend(vers if vers is not None else [-1] * len(ids))


@dataclass
class Call:
    """A call in progress: the ids to generate from, in ``segment``."""

    segment: int
    """Index of the segment the call extends or starts."""
    prompt_ids: list[int]
    """Everything the model sees for this call."""
    extended: bool
    """True when the call continued an earlier one (its ids reused), False when it started a segment."""


@dataclass
class ChatRecorder:
    """The segments of one agent episode (see the module docstring). Not thread-safe: one event loop."""

    tokenizer: Any
    segments: list[_Segment] = field(default_factory=list)

    # ------------------------------------------------------------------ rendering
    def _render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, gen: bool) -> str:
        try:
            return self.tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=gen)
        except Exception as exc:  # noqa: BLE001 - a template error names what it could not render
            raise RequestError(f"the chat template cannot render these messages: {type(exc).__name__}: {exc}", "messages") from None

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False)) if text else []

    def _glue(self, seg: _Segment, reply: Reply, new: list[dict[str, Any]]) -> list[int] | None:
        """Ids that follow ``reply``'s own ids when ``new`` messages come after it: what the
        template writes after an assistant reply (its end of turn, unless the model wrote that
        itself), the new messages and the next assistant header. None when the template does not
        show the reply verbatim (the conversation then starts a segment)."""
        follow = self._render(seg.messages + [{"role": "assistant", "content": _SENTINEL}, *new], seg.tools, True)
        at = follow.rfind(_SENTINEL)
        if at < 0 or follow.count(_SENTINEL) != 1:
            return None
        glue = follow[at + len(_SENTINEL):]
        if reply.special_suffix and glue.startswith(reply.special_suffix):
            glue = glue[len(reply.special_suffix):]  # the model wrote the end of turn (EOS) itself
        return self._encode(glue)

    # ------------------------------------------------------------------ calls
    def begin(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> Call:
        """The prompt of a call with these (template) ``messages`` and ``tools``: the newest
        conversation it extends, else a new segment. RequestError if the template cannot render it."""
        tools_key = json.dumps(tools or [], sort_keys=True, ensure_ascii=False)
        keys = [_key(m) for m in messages]
        for index in range(len(self.segments) - 1, -1, -1):
            seg = self.segments[index]
            n = len(seg.messages)
            if seg.replies is None or seg.tools_key != tools_key or len(messages) <= n:
                continue
            if [_key(m) for m in seg.messages] != keys[:n]:
                continue
            chosen = next((r for r in seg.replies if _key(r.message) == keys[n]), None)
            if chosen is None:
                continue
            glue = self._glue(seg, chosen, messages[n + 1:])
            if glue is None:
                continue
            g = chosen.generation
            seg.extend(g.token_ids, 1, g.logprobs, g.versions)
            seg.extend(glue, 0)
            seg.messages, seg.replies = list(messages), None
            return Call(index, list(seg.tokens), True)
        ids = self._encode(self._render(messages, tools, True))
        seg = _Segment(tools_key=tools_key, messages=list(messages), tools=tools)
        seg.extend(ids, 0)
        self.segments.append(seg)
        return Call(len(self.segments) - 1, list(ids), False)

    def finish(self, call: Call, replies: list[Reply]) -> None:
        """Record the choices a call returned; the next call may continue any of them."""
        self.segments[call.segment].replies = list(replies)

    def fail(self, call: Call) -> None:
        """The call produced nothing (refused or lost): its segment cannot be continued from it."""
        seg = self.segments[call.segment]
        seg.replies = []

    # ------------------------------------------------------------------ the episode
    def trajectory_parts(self) -> tuple[list[int], list[int], list[float], list[int], tuple[int, ...]]:
        """``(tokens, loss_mask, logprobs, versions, segment_starts)`` of the whole episode.

        A segment whose newest call was never continued ends with that call's first choice (the
        one a single-choice agent acts on); the other choices of a call are not trained. Segments
        in which the model wrote nothing are left out."""
        tokens: list[int] = []
        mask: list[int] = []
        lps: list[float] = []
        vers: list[int] = []
        starts: list[int] = []
        for seg in self.segments:
            t, m, lp, v = list(seg.tokens), list(seg.mask), list(seg.logprobs), list(seg.versions)
            if seg.replies:
                g = seg.replies[0].generation
                t += g.token_ids
                m += [1] * len(g.token_ids)
                lp += list(g.logprobs)
                v += list(g.versions)
            if not any(m):
                continue
            if tokens:
                starts.append(len(tokens))
            tokens += t
            mask += m
            lps += lp
            vers += v
        return tokens, mask, lps, vers, tuple(starts)

    def last_conversation(self) -> list[dict[str, Any]]:
        """The newest conversation's messages (template form) followed by the model's reply to
        its last call (its first choice), when it has one; [] before any call."""
        if not self.segments:
            return []
        seg = self.segments[-1]
        return [dict(m) for m in seg.messages] + ([dict(seg.replies[0].message)] if seg.replies else [])

    def text(self) -> str:
        """The episode as the model saw it, segment after segment (for reading)."""
        tokens, _, _, _, starts = self.trajectory_parts()
        bounds = [0, *starts, len(tokens)]
        return "\n\n[new segment]\n\n".join(
            self.tokenizer.decode(tokens[a:b], skip_special_tokens=False) for a, b in zip(bounds[:-1], bounds[1:])
        )


def episode_trajectory(recorder: ChatRecorder, **fields: Any) -> Trajectory:
    """The :class:`Trajectory` of a recorded episode; ``fields`` are its other fields (reward,
    group_id, sample_index, prompt_index, status, metrics, info)."""
    tokens, mask, lps, vers, starts = recorder.trajectory_parts()
    return Trajectory(tokens=tokens, loss_mask=mask, behaviour_logprobs=lps, versions=vers, segment_starts=starts, **fields)
