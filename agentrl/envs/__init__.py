"""Environments: the :class:`TextEnv` and :class:`ToolEnv` base classes, tools, tool-call
parsers, rewards, built-in environments and :func:`make_env`.

``import agentrl`` registers the built-in environments with Gymnasium (:mod:`agentrl.registration`):

- ``agentrl/Calc-v0`` -> :class:`agentrl.envs.calc.CalcEnv` (``a*b+c`` with a Python interpreter)
- ``agentrl/MathTool-v0`` -> :class:`agentrl.envs.math_envs.MathToolEnv` (ReTool-style math)
- ``agentrl/Math-v0`` -> :class:`agentrl.envs.math_envs.MathEnv` (math without tools)

A new environment: see ``docs/environments.md``.
"""

from __future__ import annotations

import importlib
from typing import Any

import gymnasium

from agentrl.envs.base import AnyText, ChatMessages, Message, Status, StepResult, TextEnv
from agentrl.envs.calc import SYSTEM_PROMPT, CalcEnv, generate_problems, sample_texts
from agentrl.envs.math_envs import MathEnv, MathToolEnv
from agentrl.envs.parsers import (
    HermesParser,
    ReToolParser,
    ToolCall,
    ToolCallParser,
    ToolOutput,
    extract_boxed,
    get_parser,
    parse_code,
)
from agentrl.envs.rewards import MathReward, MathVerifier, VerifierPool, shared_verifier_pool
from agentrl.envs.tool_env import MalformedPolicy, ToolEnv
from agentrl.envs.tools import FunctionTool, PythonSession, PythonTool, Tool, ToolContext, ToolLimits, as_tool, function_tool
from agentrl.errors import AgentRLError, ConfigError, EnvError
from agentrl.registration import BUILTIN_ENVS, register_builtin_envs

__all__ = [
    "TextEnv",
    "ToolEnv",
    "Message",
    "Status",
    "StepResult",
    "ChatMessages",
    "AnyText",
    "MalformedPolicy",
    "Tool",
    "ToolContext",
    "ToolLimits",
    "FunctionTool",
    "PythonTool",
    "PythonSession",
    "function_tool",
    "as_tool",
    "ToolCall",
    "ToolOutput",
    "ToolCallParser",
    "ReToolParser",
    "HermesParser",
    "get_parser",
    "MathVerifier",
    "MathReward",
    "VerifierPool",
    "shared_verifier_pool",
    "CalcEnv",
    "MathToolEnv",
    "MathEnv",
    "SYSTEM_PROMPT",
    "generate_problems",
    "sample_texts",
    "parse_code",
    "extract_boxed",
    "make_env",
    "BUILTIN_ENVS",
]

register_builtin_envs()  # also done by ``import agentrl``; kept for code that imports this package by path


def make_env(env_id: str, **kwargs: Any) -> gymnasium.Env:
    """Build an environment from a registered id or a ``"module:Name"`` reference.

    - a registered id (``"agentrl/Calc-v0"``): ``gymnasium.make(env_id, **kwargs)`` (with
      Gymnasium's usual wrappers; the engine uses ``env.unwrapped``);
    - ``"module:Class"`` with ``Class`` a ``gymnasium.Env`` subclass: imports ``module`` (which may
      register its own ids) and returns ``Class(**kwargs)``, unwrapped;
    - ``"module:env-id"``: imports ``module``, then ``gymnasium.make("env-id", **kwargs)``.

    Raises:
        EnvError: the id is unknown, the module cannot be imported, the name is neither an Env
            class nor a registered id, or the constructor failed (the message names ``env_id``).
            A ConfigError from the constructor (an argument out of range) becomes such an
            EnvError; other agentrl errors it raises (e.g. a DataError) pass through unchanged.
    """
    try:
        from agentrl.envs.env_kwargs import check_env_kwargs, env_constructor

        if env_id in gymnasium.registry:
            check_env_kwargs(env_id, env_constructor(env_id), kwargs)
            return gymnasium.make(env_id, **kwargs)
        if ":" not in env_id:
            known = ", ".join(sorted(k for k in gymnasium.registry if k.startswith("agentrl/")))
            raise EnvError(f"unknown environment {env_id!r}: not a registered id (agentrl ids: {known}) nor 'module:Class'")
        module_name, name = env_id.split(":", 1)
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise EnvError(f"environment {env_id!r}: cannot import module {module_name!r}: {exc}") from exc
        target = getattr(module, name, None)
        if isinstance(target, type) and issubclass(target, gymnasium.Env):
            check_env_kwargs(env_id, target, kwargs)
            return target(**kwargs)
        if name in gymnasium.registry:
            check_env_kwargs(env_id, env_constructor(name), kwargs)
            return gymnasium.make(name, **kwargs)
        raise EnvError(
            f"environment {env_id!r}: {module_name!r} has no gymnasium.Env subclass named {name!r} "
            f"and {name!r} is not a registered environment id"
        )
    except ConfigError as exc:  # an env kwarg out of range: the constructor failed
        raise EnvError(f"environment {env_id!r} cannot be built: {exc}") from exc
    except AgentRLError:
        raise
    except Exception as exc:  # gymnasium.error.*, TypeError for bad kwargs, errors in the constructor
        raise EnvError(f"environment {env_id!r} cannot be built: {type(exc).__name__}: {exc}") from exc
