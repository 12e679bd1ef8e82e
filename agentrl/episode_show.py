"""``agentrl eval RECIPE --show N``: episodes as plain text on the console, turn by turn.

An episode record of ``eval_samples.jsonl`` or ``samples.jsonl`` (its ``spans``, or ``text``) is
split into turns as the report's trajectory browser splits it
(:func:`agentrl.report_html.episode_turns`: ChatML markers), and printed as::

    ── episode 1 of 3 · reward 1.000 · ok · 2 turns, 1 tool call ──
    system     You solve arithmetic problems with a Python interpreter...
    user       Compute 12*34+5.
    assistant  ▶ tool call: <code>12*34+5</code>
    tool       <interpreter>
               413
               </interpreter>
    assistant  \\boxed{413}

The chat template's own markers (``<|im_start|>role``, ``<|im_end|>``, ``<|endoftext|>``) are left
out; a template without ChatML markers shows as one block. Plain text, never rich markup: brackets
are printed as written.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from agentrl.report_html import episode_turns

__all__ = ["read_episodes", "render_episode"]

_MARKERS = re.compile(r"<\|im_start\|>\w+\n|<\|im_end\|>\n?|<\|endoftext\|>")
_WIDTH = 11
"""Width of the role column."""


def _clean(text: str) -> str:
    return _MARKERS.sub("", text)


def render_episode(record: dict[str, Any], index: int, total: int) -> str:
    """Episode ``record`` (a line of ``eval_samples.jsonl``) as text: a header with its reward,
    status, turns and tool calls (and its error), then one block per turn, a role column on
    the left; the assistant's tool calls (``<tool_call>``, ``<code>``) are marked ``▶ tool call:``."""
    spans = record.get("spans") or ([[record.get("text", ""), -1]] if record.get("text") else [])
    calls = int(record.get("tool_calls", 0))
    head = f"episode {index} of {total} · reward {float(record.get('reward', 0.0)):.3f} · {record.get('status', '?')}"
    if "turns" in record:
        turns_n = int(record["turns"])
        head += f" · {turns_n} turn{'s' if turns_n != 1 else ''}, {calls} tool call{'s' if calls != 1 else ''}"
    lines = [f"── {head} ──"]
    for turn in episode_turns(spans):
        text = ""
        for piece, _version, in_call in turn["pieces"]:
            piece = _clean(piece)
            if in_call and piece.strip() and not text.endswith("▶ tool call: ") and (piece.startswith("<tool_call>") or piece.startswith("<code>")):
                text += "▶ tool call: "
            text += piece
        text = text.strip("\n")
        if not text.strip():
            continue
        role = turn["role"] if turn["role"] != "text" else ""
        body = text.splitlines() or [""]
        lines.append(f"{role:<{_WIDTH}}{body[0]}")
        lines += [f"{'':<{_WIDTH}}{line}" for line in body[1:]]
    if record.get("error"):
        lines.append(f"{'error':<{_WIDTH}}{record['error']}")
    return "\n".join(lines)


def read_episodes(path: str | Path) -> list[dict[str, Any]]:
    """The episode records of ``path`` (``eval_samples.jsonl`` of one evaluation's own run
    directory); a line cut by a crash is left out; [] without the file."""
    p = Path(path)
    if not p.exists():
        return []
    out = []
    for line in p.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out

