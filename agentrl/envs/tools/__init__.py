"""Tools for :class:`~agentrl.envs.tool_env.ToolEnv`: plain typed Python functions, and Python code
run in the sandbox.

A **function tool** is any typed function; its JSON schema comes from the signature and the
docstring (Google ``Args:`` or reST ``:param x:`` sections)::

    def add(a: int, b: int = 0) -> int:
        \"\"\"Add two integers.

        Args:
            a: the first addend.
            b: the second addend.
        \"\"\"
        return a + b

    function_tool(add).schema() == {"type": "function", "function": {
        "name": "add", "description": "Add two integers.",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "integer", "description": "the first addend."},
            "b": {"type": "integer", "description": "the second addend.", "default": 0}},
          "required": ["a"], "additionalProperties": False}}}

Supported annotations: ``str``, ``int``, ``float``, ``bool``, ``None``, ``list[T]``,
``tuple[T, ...]``, ``dict[str, T]``, ``Literal[...]``, ``Enum`` subclasses, ``T | None`` /
``Optional[T]``, unions, ``Annotated[T, "description"]`` and ``Any``. Arguments are checked
against the signature before the call (unknown or missing arguments and wrong JSON types are a
:class:`~agentrl.errors.ToolCallError`; an integer is accepted for a ``float``). The function may
be sync (run in a worker thread) or ``async``; its return value is shown with ``str()`` (``None``
as an empty output); an exception it raises is shown to the model as ``"{Type}: {message}"`` —
except an :class:`~agentrl.errors.InfraError`, which marks the episode as an infrastructure failure.

A **sandbox tool** (:class:`PythonTool`) runs model-written code with
:meth:`agentrl.sandbox.Sandbox.run`. With ``session=True`` the interpreter state persists across the
calls of one episode (notebook-like); see :class:`PythonSession`.

The package: :mod:`~agentrl.envs.tools.protocols` (what a tool is, :class:`ToolContext` and its
:class:`ToolLimits`), :mod:`~agentrl.envs.tools.function_tools` (functions → JSON schemas) and
:mod:`~agentrl.envs.tools.python_tool` (the sandboxed Python tool and its session). Everything is
importable from here too.
"""

from __future__ import annotations

from agentrl.envs.tools.function_tools import FunctionTool, as_tool, function_tool, json_schema, json_type, parse_docstring
from agentrl.envs.tools.protocols import Tool, ToolContext, ToolLimits, tool_schema
from agentrl.envs.tools.python_tool import (
    PythonSession,
    PythonTool,
    describe_exec,
    replay_script,
    truncate_middle,
    with_display,
)

__all__ = [
    "Tool",
    "ToolContext",
    "ToolLimits",
    "FunctionTool",
    "PythonTool",
    "PythonSession",
    "function_tool",
    "as_tool",
    "json_schema",
    "json_type",
    "parse_docstring",
    "tool_schema",
    "with_display",
    "replay_script",
    "describe_exec",
    "truncate_middle",
]
