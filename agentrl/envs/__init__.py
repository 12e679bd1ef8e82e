"""Environments: the :class:`TextEnv` base class, parsers, built-in envs and :func:`make_env`.

Importing this package registers the built-in environments with Gymnasium (once):

- ``agentrl/Calc-v0`` -> :class:`agentrl.envs.calc.CalcEnv`
"""

from __future__ import annotations

import importlib
from typing import Any

import gymnasium

from agentrl.envs.base import AnyText, ChatMessages, Message, Status, StepResult, TextEnv
from agentrl.envs.calc import SYSTEM_PROMPT, CalcEnv, generate_problems, sample_texts
from agentrl.envs.parsers import extract_boxed, parse_code
from agentrl.errors import AgentRLError, EnvError

__all__ = [
    "TextEnv",
    "Message",
    "Status",
    "StepResult",
    "ChatMessages",
    "AnyText",
    "CalcEnv",
    "SYSTEM_PROMPT",
    "generate_problems",
    "sample_texts",
    "parse_code",
    "extract_boxed",
    "make_env",
]

BUILTIN_ENVS: dict[str, str] = {"agentrl/Calc-v0": "agentrl.envs.calc:CalcEnv"}
"""Environment ids registered on import, and their entry points."""

for _env_id, _entry_point in BUILTIN_ENVS.items():
    if _env_id not in gymnasium.registry:
        gymnasium.register(id=_env_id, entry_point=_entry_point)


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
            agentrl errors raised by the constructor (e.g. a DataError) pass through unchanged.
    """
    try:
        if env_id in gymnasium.registry:
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
            return target(**kwargs)
        if name in gymnasium.registry:
            return gymnasium.make(name, **kwargs)
        raise EnvError(
            f"environment {env_id!r}: {module_name!r} has no gymnasium.Env subclass named {name!r} "
            f"and {name!r} is not a registered environment id"
        )
    except AgentRLError:
        raise
    except Exception as exc:  # gymnasium.error.*, TypeError for bad kwargs, errors in the constructor
        raise EnvError(f"environment {env_id!r} cannot be built: {type(exc).__name__}: {exc}") from exc
