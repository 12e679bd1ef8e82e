"""Parsers for what models write: ReTool ``<code>`` tool calls and ``\\boxed{}`` final answers."""

from __future__ import annotations

import re

from agentrl.errors import ToolCallError

__all__ = ["CODE_OPEN", "CODE_CLOSE", "parse_code", "extract_boxed"]

CODE_OPEN = "<code>"
CODE_CLOSE = "</code>"

_FENCE = re.compile(r"^\s*```[ \t]*(?:python3?|py)?[ \t]*\n(?P<body>.*?)(?:\n[ \t]*```)?\s*$", re.DOTALL | re.IGNORECASE)


def parse_code(action: str) -> str | None:
    """The code of the first ``<code>...</code>`` block in ``action``, or None if there is none.

    A Markdown fence inside the tags (````` ```python\\n...\\n``` `````) is removed. The returned
    code has no leading/trailing blank lines. Text outside the first block, later blocks and a
    stray ``</code>`` before any ``<code>`` are ignored.

    Raises:
        ToolCallError: the first ``<code>`` is never closed by ``</code>``, or the block is empty.
    """
    start = action.find(CODE_OPEN)
    if start < 0:
        return None
    body_start = start + len(CODE_OPEN)
    end = action.find(CODE_CLOSE, body_start)
    if end < 0:
        raise ToolCallError(
            f"the {CODE_OPEN} tag at character {start} is never closed: "
            f"write the code as {CODE_OPEN}...{CODE_CLOSE}"
        )
    code = action[body_start:end]
    fenced = _FENCE.match(code)
    if fenced is not None:
        code = fenced.group("body")
    code = code.strip("\n").rstrip()
    if not code.strip():
        raise ToolCallError(f"the {CODE_OPEN}{CODE_CLOSE} block at character {start} is empty")
    return code


def extract_boxed(text: str) -> str | None:
    """The content of the **last** ``\\boxed{...}`` in ``text``, nested braces included, or None.

    ``"\\boxed{\\frac{1}{2}}"`` gives ``"\\frac{1}{2}"``. None when there is no ``\\boxed{`` or
    when the last one is never closed (unbalanced braces). The content is returned as written
    (no stripping).
    """
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i = start + len("\\boxed{")
    depth = 1
    for j in range(i, len(text)):
        c = text[j]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None
