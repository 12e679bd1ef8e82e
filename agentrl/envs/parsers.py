"""Parsers for what models write: tool calls and ``\\boxed{}`` final answers.

Two tool-call formats, each a :class:`ToolCallParser` (parse calls out of an action, format the
tools' outputs as the next messages, describe the tools in the system prompt):

- :class:`ReToolParser` — ReTool's code interpreter: ``<code>python</code>`` in,
  ``<interpreter>output</interpreter>`` out. Every block is a call of one code tool
  (``"python"``, argument ``code``).
- :class:`HermesParser` — Hermes/Qwen JSON calls: ``<tool_call>{"name": ..., "arguments": {...}}
  </tool_call>`` in, ``<tool_response>output</tool_response>`` out (``"hermes"``: the environment
  writes the ``<tool_response>`` tags; ``"qwen"``: the chat template does, as Qwen2.5/Qwen3's do).

Parsers never drop a call silently: a call they cannot read (an unclosed or nested tag, bad JSON,
no tool name) comes back as a :class:`ToolCall` whose ``error`` says what is wrong, and the
environment applies its malformed-call policy to it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from agentrl.errors import ConfigError, ToolCallError

__all__ = [
    "CODE_OPEN",
    "CODE_CLOSE",
    "parse_code",
    "extract_boxed",
    "ToolCall",
    "ToolOutput",
    "ToolCallParser",
    "ReToolParser",
    "HermesParser",
    "get_parser",
    "PARSERS",
]

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


# --------------------------------------------------------------------------------------------
# Tool calls
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolCall:
    """One tool call found in an action.

    Attributes:
        name: the tool's name as the model wrote it (``""`` when the call is too broken to say).
        arguments: the call's arguments (``{}`` for a malformed call).
        raw: the call's text as written, tags included (for a truncated call: to the end).
        start: the character offset of the call in the action.
        error: why the call is malformed (unclosed/nested tag, bad JSON, no name...), or None for
            a well-formed call. Whether ``name`` is a known tool and the arguments fit it is
            checked later, by the environment.
    """

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    raw: str = ""
    start: int = 0
    error: str | None = None


@dataclass(frozen=True)
class ToolOutput:
    """What one tool call produced, as the model will see it.

    Attributes:
        text: the output text (already cut to the environment's ``max_output_chars``).
        error: True when the call failed (malformed call, unknown tool, bad arguments, the tool
            raised or timed out, the code raised, timed out or ran out of memory); counted in
            ``info["tool_errors"]``.
        name: the tool that was called (``""`` if unknown).
    """

    text: str
    error: bool = False
    name: str = ""


@runtime_checkable
class ToolCallParser(Protocol):
    """A tool-call format: how calls are written and how results are shown."""

    name: str
    """Short name (``"retool"``, ``"hermes"``, ``"qwen"``)."""

    def parse(self, action: str) -> list[ToolCall]:
        """Every tool call in ``action``, in order; ``[]`` when there is none (a final answer)."""
        ...

    def format_outputs(self, outputs: list[ToolOutput]) -> list[dict[str, str]]:
        """The messages that answer the calls (``outputs`` in call order), e.g. one
        ``{"role": "tool", "content": ...}`` message."""
        ...

    def describe_tools(self, schemas: list[dict[str, Any]]) -> str:
        """Instructions for the system prompt: how to call the tools given as OpenAI-style
        function schemas (``{"type": "function", "function": {...}}``)."""
        ...


class ReToolParser:
    """ReTool's format: ``<code>...</code>`` blocks are calls of the code tool.

    Every block is one call ``ToolCall(name=code_tool, arguments={"code": code})`` (a Markdown
    fence inside the tags is removed, as in :func:`parse_code`). An unclosed ``<code>`` (typically
    generation cut at ``max_tokens``) and an empty block are malformed calls. A ``</code>`` with
    no ``<code>`` before it is ordinary text. Code may itself contain the text ``<code>`` (in a
    string); only ``</code>`` ends a block.

    The outputs of one action become one ``tool`` message: one
    ``<interpreter>\\n{output}\\n</interpreter>`` block per call, joined by newlines.

    Args:
        code_tool: the name of the tool ``<code>`` blocks call.
    """

    name = "retool"

    def __init__(self, code_tool: str = "python") -> None:
        self.code_tool = code_tool

    def parse(self, action: str) -> list[ToolCall]:
        calls: list[ToolCall] = []
        pos = 0
        while True:
            start = action.find(CODE_OPEN, pos)
            if start < 0:
                return calls
            end = action.find(CODE_CLOSE, start + len(CODE_OPEN))
            stop = len(action) if end < 0 else end + len(CODE_CLOSE)
            raw = action[start:stop]
            try:
                code = parse_code(raw)
            except ToolCallError as exc:
                calls.append(ToolCall(self.code_tool, {}, raw, start, _at(str(exc), start)))
            else:
                calls.append(ToolCall(self.code_tool, {"code": code}, raw, start))
            if end < 0:
                return calls
            pos = stop

    def format_outputs(self, outputs: list[ToolOutput]) -> list[dict[str, str]]:
        content = "\n".join(f"<interpreter>\n{o.text.rstrip()}\n</interpreter>" for o in outputs)
        return [{"role": "tool", "content": content}]

    def describe_tools(self, schemas: list[dict[str, Any]]) -> str:
        others = [s for s in schemas if _schema_name(s) != self.code_tool]
        if others:
            names = ", ".join(_schema_name(s) for s in others)
            raise ConfigError(f"the retool format has only the code tool {self.code_tool!r}; use 'hermes' for {names}")
        return (
            "To run Python, write the code between <code> and </code>; its output (what it prints) "
            "comes back between <interpreter> and </interpreter>."
        )


def _at(message: str, offset: int) -> str:
    """``parse_code`` counts from the start of the block it was given; report the action offset."""
    return re.sub(r"at character 0\b", f"at character {offset}", message, count=1)


TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"


class HermesParser:
    """Hermes/Qwen JSON tool calls: ``<tool_call>{"name": "f", "arguments": {...}}</tool_call>``.

    Every ``<tool_call>`` block is one call, in order. The body is a JSON object (a Markdown
    ````` ```json ````` fence around it is removed) with a string ``"name"`` and an object
    ``"arguments"`` (also accepted: ``"parameters"``, or ``arguments`` given as a JSON string
    holding an object; missing means ``{}``). Malformed calls (each with its ``error``):

    - a ``<tool_call>`` never closed (truncated generation);
    - a ``<tool_call>`` opened inside another one (calls cannot nest) — unless the inner tag is
      inside a JSON string of a body that parses;
    - a body that is not valid JSON, not an object, or has no string ``"name"``.

    A ``</tool_call>`` without an opening tag is ordinary text.

    Args:
        wrap_responses: True (``"hermes"``): each output becomes a ``tool`` message
            ``<tool_response>\\n{output}\\n</tool_response>``. False (``"qwen"``): the message
            holds the bare output, for chat templates that add the tags themselves (Qwen2.5 and
            Qwen3 render tool messages as ``<tool_response>...</tool_response>`` in a user turn).
    """

    def __init__(self, wrap_responses: bool = True) -> None:
        self.wrap_responses = wrap_responses
        self.name = "hermes" if wrap_responses else "qwen"

    def parse(self, action: str) -> list[ToolCall]:
        calls: list[ToolCall] = []
        pos = 0
        while True:
            start = action.find(TOOL_CALL_OPEN, pos)
            if start < 0:
                return calls
            body_start = start + len(TOOL_CALL_OPEN)
            end = action.find(TOOL_CALL_CLOSE, body_start)
            if end < 0:
                calls.append(
                    ToolCall(
                        "", {}, action[start:], start,
                        f"the {TOOL_CALL_OPEN} at character {start} is never closed by {TOOL_CALL_CLOSE} "
                        "(was the output cut off?)",
                    )
                )
                return calls
            stop = end + len(TOOL_CALL_CLOSE)
            calls.append(self._parse_body(action[body_start:end], action[start:stop], start))
            pos = stop

    def _parse_body(self, body: str, raw: str, start: int) -> ToolCall:
        text = body.strip()
        fenced = re.fullmatch(r"```[ \t]*(?:json)?[ \t]*\n(.*?)\n?[ \t]*```", text, re.DOTALL | re.IGNORECASE)
        if fenced is not None:
            text = fenced.group(1).strip()
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            if TOOL_CALL_OPEN in body:
                return ToolCall("", {}, raw, start, f"the {TOOL_CALL_OPEN} at character {start} holds another {TOOL_CALL_OPEN}: calls cannot be nested")
            if not text:
                return ToolCall("", {}, raw, start, f"the {TOOL_CALL_OPEN} at character {start} is empty")
            return ToolCall("", {}, raw, start, f"the {TOOL_CALL_OPEN} at character {start} is not valid JSON: {exc}")
        if not isinstance(obj, dict):
            return ToolCall("", {}, raw, start, f"the {TOOL_CALL_OPEN} at character {start} must hold a JSON object, got {type(obj).__name__}")
        name = obj.get("name")
        if not isinstance(name, str) or not name.strip():
            return ToolCall("", {}, raw, start, f'the {TOOL_CALL_OPEN} at character {start} has no "name" string')
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError as exc:
                return ToolCall(name, {}, raw, start, f'the "arguments" of {name!r} are a string that is not valid JSON: {exc}')
        if args is None:
            args = {}
        if not isinstance(args, dict):
            return ToolCall(name, {}, raw, start, f'the "arguments" of {name!r} must be a JSON object, got {type(args).__name__}')
        return ToolCall(name, args, raw, start)

    def format_outputs(self, outputs: list[ToolOutput]) -> list[dict[str, str]]:
        if self.wrap_responses:
            return [{"role": "tool", "content": f"<tool_response>\n{o.text.rstrip()}\n</tool_response>"} for o in outputs]
        return [{"role": "tool", "content": o.text.rstrip()} for o in outputs]

    def describe_tools(self, schemas: list[dict[str, Any]]) -> str:
        tools = "\n".join(json.dumps(s, ensure_ascii=False) for s in schemas)
        return (
            "You may call one or more functions to assist with the user query. The functions are "
            "described within <tools></tools> XML tags:\n"
            f"<tools>\n{tools}\n</tools>\n\n"
            "For each function call, write a JSON object with the function name and arguments "
            "within <tool_call></tool_call> XML tags:\n"
            '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>\n'
            "The result of each call comes back within <tool_response></tool_response> XML tags."
        )


def _schema_name(schema: dict[str, Any]) -> str:
    return str(schema.get("function", schema).get("name", ""))


PARSERS: dict[str, type] = {"retool": ReToolParser, "hermes": HermesParser, "qwen": HermesParser}
"""Parser names accepted by :func:`get_parser` (and the ``parser`` argument of ToolEnv)."""


def get_parser(parser: str | ToolCallParser) -> ToolCallParser:
    """A parser from its name (``"retool"``, ``"hermes"``, ``"qwen"``), or ``parser`` itself.

    Raises:
        ConfigError: an unknown name, or an object without ``parse``/``format_outputs``/``describe_tools``.
    """
    if isinstance(parser, str):
        if parser == "retool":
            return ReToolParser()
        if parser in ("hermes", "qwen"):
            return HermesParser(wrap_responses=parser == "hermes")
        raise ConfigError(f"unknown tool-call parser {parser!r}; expected one of {sorted(PARSERS)} or a ToolCallParser")
    if not isinstance(parser, ToolCallParser):
        raise ConfigError(f"{parser!r} is not a ToolCallParser (needs name, parse, format_outputs, describe_tools)")
    return parser
