"""``env.kwargs`` checked against the environment's constructor before it is called: an unknown
keyword or a value of the wrong type is an :class:`~agentrl.errors.EnvError` naming the kwarg,
what was given and what the signature expects, instead of a ``TypeError`` from deep inside the
constructor (``'<' not supported between 'str' and 'int'``)."""

from __future__ import annotations

import inspect
import sys
import typing
from typing import Any

import gymnasium

from agentrl.errors import EnvError

__all__ = ["check_env_kwargs", "env_constructor"]


def env_constructor(env_id: str, target: Any = None) -> Any:
    """The class (or factory) that builds ``env_id``: ``target`` when given, else the entry point
    of the registered id; None when it cannot be resolved without building the environment."""
    if target is not None:
        return target
    try:
        entry = gymnasium.spec(env_id).entry_point
        if isinstance(entry, str):
            from gymnasium.envs.registration import load_env_creator

            entry = load_env_creator(entry)
        return entry
    except Exception:  # an id gymnasium resolves some other way: the constructor's own errors stand
        return None


def _describe(value: Any) -> str:
    text = repr(value)
    return f"{text[:60]}{'...' if len(text) > 60 else ''} ({type(value).__name__})"


def _hints(func: Any) -> dict[str, Any]:
    """``func``'s parameter annotations, each resolved on its own (one that names a class
    imported only for type checking is left out, the others are kept)."""
    try:
        return typing.get_type_hints(func)
    except Exception:
        pass
    namespace = dict(vars(sys.modules.get(getattr(func, "__module__", ""), typing)))
    hints = {}
    for key, ann in getattr(func, "__annotations__", {}).items():
        try:
            hints[key] = eval(ann, namespace) if isinstance(ann, str) else ann  # noqa: S307 - the env's own annotation
        except Exception:
            continue
    return hints


def check_env_kwargs(env_id: str, constructor: Any, kwargs: dict[str, Any]) -> None:
    """Raise EnvError when ``kwargs`` do not fit ``constructor``'s signature: a name it has no
    parameter for (unless it takes ``**kwargs``), or a value its annotation rejects (checked
    strictly with pydantic: ``"3"`` is not an ``int``). Parameters without annotations, or with
    annotations that cannot be resolved, accept anything."""
    if constructor is None or not kwargs:
        return
    init = constructor.__init__ if isinstance(constructor, type) else constructor
    try:
        params = inspect.signature(init).parameters
    except (TypeError, ValueError):
        return
    name = getattr(constructor, "__qualname__", str(constructor))
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    named = [p for p in params if p != "self" and params[p].kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    hints = _hints(init)
    from pydantic import TypeAdapter, ValidationError

    for key, value in kwargs.items():
        if key not in params or params[key].kind not in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY):
            if takes_any:
                continue
            raise EnvError(f"environment {env_id!r}: env.kwargs.{key}: {name} has no parameter {key!r} (its parameters: {', '.join(named) or 'none'})")
        hint = hints.get(key)
        if hint is None or hint is Any:
            continue
        try:
            TypeAdapter(hint).validate_python(value, strict=True)
        except ValidationError as exc:
            why = exc.errors()[0]["msg"] if exc.errors() else str(exc)
            shown = getattr(hint, "__name__", None) or str(hint).replace("typing.", "")
            raise EnvError(f"environment {env_id!r}: env.kwargs.{key}: got {_describe(value)}; {name} expects {shown} ({why})") from None
        except Exception:  # an annotation pydantic cannot check (a protocol, a class it has no schema for)
            continue
