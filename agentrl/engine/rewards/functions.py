"""Reward functions: the user's own Python functions of a finished episode, weighted into its reward
(TRL's ``reward_funcs`` for agentrl).

A recipe names them in ``[reward]``, each with its weight::

    [[reward.functions]]
    fn = "my_rewards:brevity"     # module:function, found beside the recipe or in the current directory
    weight = 0.5

or, each with weight 1, ``functions = ["my_rewards:brevity", "my_rewards:polite"]``.

A function names the keyword arguments it wants among :data:`PARAMETERS` (``**kwargs`` takes
them all):

- ``completion`` (str): the model's last turn, decoded without special tokens (its final answer);
- ``messages`` (list of ``{"role", "content"}`` dicts): the whole conversation: the prompt's
  messages, every model turn and every message the environment answered with (for an agent
  episode: its last conversation and the model's last reply);
- ``row`` (dict): the dataset row of the episode;
- ``env_reward`` (float): what the environment's rule-based rewards summed to.

It returns a number (``int`` or ``float``, not a bool); it may be ``async def``. A plain function
runs in a worker thread (so that its timeout holds, and the rollout worker's other episodes go on
meanwhile); several episodes may call it at once.

A function that raises, returns anything but a finite number, or does not return within its
``timeout_s`` raises :class:`~agentrl.errors.RewardModelError`: its episode becomes an
infrastructure failure kept out of the loss (never a reward of 0), as when the judge fails
(:mod:`agentrl.engine.rewards.scoring`). A reference that does not import, is not callable or
asks for an argument it cannot be given is a :class:`~agentrl.errors.ConfigError` naming the
recipe key (``agentrl check`` refuses it).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import math
import numbers
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import anyio

from agentrl.errors import ConfigError, RewardModelError

__all__ = ["PARAMETERS", "RewardFunction", "RewardFunctionSpec", "function_specs", "load_reward_function"]

PARAMETERS = ("completion", "messages", "row", "env_reward")
"""The keyword arguments a reward function may ask for (see the module docstring)."""


@dataclass(frozen=True)
class RewardFunctionSpec:
    """One reward function as the recipe names it."""

    ref: str
    """``"module:function"`` (``package.module:object.attribute`` also works)."""
    weight: float = 1.0
    """Weight of its value in the episode's reward."""
    timeout_s: float = 60.0
    """Longest wait for its value for one episode, seconds."""
    key: str = "reward.functions"
    """Where the recipe names it (``reward.functions[0].fn``): error messages show it."""
    part: str = ""
    """Name of its value among the episode's reward parts and the step metrics (``fn/<function>``;
    empty: ``fn/`` + the function's name in ``ref``)."""

    @property
    def metric(self) -> str:
        """The key of this function's value in the episode's metrics (``fn/brevity``)."""
        return self.part or "fn/" + self.ref.rpartition(":")[2]


def function_specs(entries: Sequence[tuple[str, float, float]], key: str = "reward.functions") -> tuple[RewardFunctionSpec, ...]:
    """Specs of ``entries`` (``(ref, weight, timeout_s)`` in recipe order, found under ``key``),
    each with a metric name of its own (``fn/brevity``; a name used twice gets ``#2``, ``#3``...)."""
    specs = []
    seen: dict[str, int] = {}
    for i, (ref, weight, timeout_s) in enumerate(entries):
        name = "fn/" + ref.rpartition(":")[2]
        seen[name] = seen.get(name, 0) + 1
        part = name if seen[name] == 1 else f"{name}#{seen[name]}"
        specs.append(RewardFunctionSpec(ref=ref, weight=float(weight), timeout_s=float(timeout_s), key=f"{key}[{i}].fn", part=part))
    return tuple(specs)


def load_reward_function(ref: str, key: str = "reward.functions") -> Callable[..., Any]:
    """The callable ``ref`` (``"module:function"``) names. ConfigError, naming ``key`` and
    ``ref``, when it is not of that form, its module does not import, the name is missing or not
    callable, or it requires an argument outside :data:`PARAMETERS` (or a positional-only one)."""
    where = f"{key}: {ref!r}"
    if not isinstance(ref, str) or ref.count(":") != 1 or not all(ref.split(":")):
        raise ConfigError(f"{where}: expected 'module:function'")
    module_name, attr = ref.split(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any failure to import is the user's module
        raise ConfigError(
            f"{where}: cannot import module {module_name!r}: {type(exc).__name__}: {exc} "
            "(modules are found beside the recipe or in the current directory)"
        ) from None
    target: Any = module
    for part in attr.split("."):
        target = getattr(target, part, None)
        if target is None:
            raise ConfigError(f"{where}: module {module_name!r} has no attribute {attr!r}")
    if not callable(target):
        raise ConfigError(f"{where}: {attr!r} is a {type(target).__name__}, not a function")
    _check_signature(target, where)
    return target


def _check_signature(fn: Callable[..., Any], where: str) -> None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: it gets what it asks for at call time
        return
    allowed = ", ".join(PARAMETERS)
    for p in sig.parameters.values():
        if p.kind is p.POSITIONAL_ONLY and p.default is p.empty:
            raise ConfigError(f"{where}: its parameter {p.name!r} is positional-only; a reward function is called with keywords ({allowed})")
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in PARAMETERS and p.default is p.empty:
            raise ConfigError(f"{where}: it requires {p.name!r}, which a reward function is never given; it may ask for any of {allowed}")


def _wanted(fn: Callable[..., Any]) -> tuple[str, ...]:
    """The :data:`PARAMETERS` ``fn`` asks for (all of them when it takes ``**kwargs``)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return PARAMETERS
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return PARAMETERS
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return tuple(n for n in PARAMETERS if n in names)


def _is_async(fn: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


class RewardFunction:
    """A loaded reward function: ``await f(episode)`` is its value for one episode."""

    def __init__(self, spec: RewardFunctionSpec) -> None:
        """Load ``spec.ref`` (ConfigError as :func:`load_reward_function` says)."""
        self.spec = spec
        self.fn = load_reward_function(spec.ref, spec.key)
        self.wants = _wanted(self.fn)
        self.is_async = _is_async(self.fn)

    async def __call__(self, episode: dict[str, Any]) -> float:
        """The function's value for ``episode`` (a dict holding every name of :data:`PARAMETERS`).
        RewardModelError (naming the function) when it raises, times out or returns anything but
        a finite number."""
        s = self.spec
        kwargs = {name: episode[name] for name in self.wants}
        try:
            with anyio.fail_after(s.timeout_s):
                if self.is_async:
                    value = await self.fn(**kwargs)
                else:
                    value = await anyio.to_thread.run_sync(functools.partial(self.fn, **kwargs), abandon_on_cancel=True)
                    if inspect.isawaitable(value):
                        value = await value
        except TimeoutError:
            raise RewardModelError(f"reward function {s.ref}: no value within {s.timeout_s:g} s ({s.key.removesuffix('.fn')}.timeout_s)") from None
        except Exception as exc:  # noqa: BLE001 - the function is user code: any exception is its failure
            where = traceback.extract_tb(exc.__traceback__)[-1]
            raise RewardModelError(
                f"reward function {s.ref} raised {type(exc).__name__}: {exc} (at {where.filename}:{where.lineno})"
            ) from exc
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise RewardModelError(f"reward function {s.ref} returned {value!r} ({type(value).__name__}); expected a float")
        if not math.isfinite(float(value)):
            raise RewardModelError(f"reward function {s.ref} returned {float(value)}, not a finite number")
        return float(value)
