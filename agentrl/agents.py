"""Agent programs: what agent code can use while agentrl trains it.

An *agent* is ``async def agent(client: openai.AsyncOpenAI, row: dict) -> float`` (or
:class:`AgentResult`, or a dict with ``"reward"``), named in a recipe as ``[env] agent =
"module:function"``. Each episode calls it once with a client of its own whose requests go to the
policy being trained (through agentrl's gateway, :mod:`agentrl.engine.episodes.gateway`) and with the
dataset row. Pass ``model=MODEL`` (the name the gateway serves, ``"policy"`` unless the recipe's
``[env] agent_model`` says otherwise) in every call.

Tools run wherever the agent runs them. :func:`run_code` runs Python in the episode's sandbox
(the recipe's ``[sandbox]``: isolated, time- and memory-limited); :data:`PYTHON_TOOL` is the
function schema of such a tool, ready for ``tools=[PYTHON_TOOL]``.
"""

from __future__ import annotations

import contextvars
import importlib
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from agentrl.errors import ConfigError, InfraError

__all__ = ["MODEL", "PYTHON_TOOL", "AgentResult", "AgentFn", "run_code", "current_sandbox", "load_agent", "episode_sandbox"]

MODEL = "policy"
"""The model name the gateway serves by default (``[env] agent_model``)."""

PYTHON_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run Python code and return what it prints.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
    },
}
"""An OpenAI function schema for a Python tool (arguments: ``{"code": "..."}``)."""

AgentFn = Callable[[Any, dict[str, Any]], Awaitable[Any]]
"""``agent(client, row)``: the agent program's signature."""


@dataclass
class AgentResult:
    """What an agent may return instead of a bare reward."""

    reward: float
    """The episode's reward."""
    info: dict[str, Any] = field(default_factory=dict)
    """JSON-serialisable details kept with the episode (shown in the samples file)."""


episode_sandbox: contextvars.ContextVar[Any] = contextvars.ContextVar("agentrl_episode_sandbox", default=None)
"""The sandbox of the episode running in this context (set by the rollout worker)."""


def current_sandbox() -> Any:
    """The episode's :class:`agentrl.sandbox.Sandbox`. InfraError outside an episode or when the
    recipe runs none."""
    sandbox = episode_sandbox.get()
    if sandbox is None:
        raise InfraError("no sandbox: run_code works inside an agent episode of a recipe with a [sandbox]")
    return sandbox


async def run_code(code: str, *, timeout_s: float | None = None, max_chars: int = 2000) -> str:
    """Run ``code`` in the episode's sandbox; what it printed (stdout, then stderr), cut to its
    last ``max_chars`` characters, with a note when it timed out or exited non-zero.

    A sandbox that fails (as opposed to the code) raises InfraError: the episode is then kept out
    of the loss, as an environment episode would be."""
    result = await current_sandbox().run(code, timeout_s=timeout_s)
    out = (result.stdout or "") + (result.stderr or "")
    if result.timed_out:
        out += "\n[timed out]"
    elif result.exit_code not in (0, None):
        out += f"\n[exit code {result.exit_code}]"
    return out[-max_chars:].strip()


def load_agent(spec: str) -> AgentFn:
    """The agent function named by ``"module:function"``. ConfigError (naming ``spec``) when it
    cannot be imported or is not an ``async def`` taking ``(client, row)``."""
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        raise ConfigError(f"[env] agent {spec!r}: expected 'module:function'")
    module_name, name = spec.split(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure is the user's module
        raise ConfigError(f"[env] agent {spec!r}: cannot import {module_name!r}: {type(exc).__name__}: {exc}") from None
    fn = getattr(module, name, None)
    if fn is None:
        raise ConfigError(f"[env] agent {spec!r}: module {module_name!r} has no attribute {name!r}")
    if not inspect.iscoroutinefunction(fn):
        raise ConfigError(f"[env] agent {spec!r} must be an 'async def' function taking (client, row)")
    try:
        inspect.signature(fn).bind(None, {})
    except TypeError:
        raise ConfigError(f"[env] agent {spec!r} must accept two arguments (client, row)") from None
    return fn
