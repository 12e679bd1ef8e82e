"""What a tool is and what it may use from the environment that calls it: the :class:`Tool`
and :class:`ToolContext` protocols, the :class:`ToolLimits` an environment sets on its tools'
calls, and the OpenAI-style function schema every tool shows the model."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from agentrl.envs.parsers import ToolOutput

if TYPE_CHECKING:
    from agentrl.sandbox.base import ExecResult, Sandbox

__all__ = ["CodeCell", "CodeSession", "Tool", "ToolContext", "ToolLimits", "tool_schema"]


@dataclass(frozen=True)
class ToolLimits:
    """The limits an environment sets on the calls of its tools.

    Attributes:
        timeout_s: wall-clock limit of one code execution, seconds (None: the sandbox's default).
        memory_mb: memory limit of one code execution, MiB (None: the sandbox's default).
        tool_timeout_s: limit of one function-tool call, seconds (None: none); a
            :class:`~agentrl.envs.tools.FunctionTool`'s own ``timeout_s`` overrides it.
        deadline_grace_s: a code call with no result after :attr:`code_deadline_s` seconds is an
            infrastructure failure; this is the grace added to twice the execution limit.
    """

    timeout_s: float | None = None
    memory_mb: int | None = None
    tool_timeout_s: float | None = None
    deadline_grace_s: float = 30.0

    @property
    def code_deadline_s(self) -> float:
        """Seconds after which a code call without a result is an infrastructure failure:
        ``2 * timeout_s + deadline_grace_s`` (``timeout_s`` None counts as 30)."""
        return 2 * (self.timeout_s or 30.0) + float(self.deadline_grace_s)


class CodeCell(Protocol):
    """One piece of code a :class:`CodeSession` ran."""

    code: str
    """The code as the model wrote it."""
    wall_s: float
    """Seconds it ran."""


class CodeSession(Protocol):
    """An episode's interpreter for one code tool: the cells run so far, and running one more
    (:class:`~agentrl.envs.tools.python_tool.PythonSession` is the one agentrl ships)."""

    @property
    def cells(self) -> Sequence[CodeCell]:
        """The cells that ran, oldest first."""
        ...

    async def run(self, sandbox: Sandbox, code: str, *, timeout_s: float | None, memory_mb: int | None) -> ExecResult:
        """Run ``code`` in ``sandbox`` after the session's earlier cells (within ``timeout_s``
        seconds and ``memory_mb`` MiB; None: the sandbox's defaults)."""
        ...


@runtime_checkable
class ToolContext(Protocol):
    """What a tool may use from the environment that calls it (a :class:`ToolEnv` is one)."""

    row: dict[str, Any] | None
    """The current episode's dataset row."""

    @property
    def limits(self) -> ToolLimits:
        """The limits of this environment's tool calls (read at each call)."""
        ...

    async def get_sandbox(self) -> Sandbox:
        """The sandbox code runs in (created at the first call when the env owns it).

        Raises:
            SandboxError: it cannot be created.
        """
        ...

    def python_session(self, tool: Tool) -> CodeSession:
        """The episode's interpreter session for the code tool ``tool`` (a
        :class:`~agentrl.envs.tools.python_tool.PythonSession`; one per tool, reset with the episode)."""
        ...


@runtime_checkable
class Tool(Protocol):
    """A tool the model can call.

    Attributes:
        name: the name the model calls it by.
        description: what it does (shown to the model).
        parameters: the JSON schema (``"type": "object"``) of its arguments.
    """

    name: str
    description: str
    parameters: dict[str, Any]

    def schema(self) -> dict[str, Any]:
        """The OpenAI-style function schema ``{"type": "function", "function": {name, description, parameters}}``."""
        ...

    async def call(self, arguments: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        """Run the tool; return what the model sees.

        Raises:
            ToolCallError: the arguments do not fit the tool (the model's mistake).
            InfraError: the infrastructure failed (the episode is discarded).
        """
        ...


def tool_schema(name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
    """The OpenAI-style function schema ``{"type": "function", "function": {name, description,
    parameters}}`` of a tool named ``name`` whose arguments have the JSON schema ``parameters``."""
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}
