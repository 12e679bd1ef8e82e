"""agentrl: asynchronous, off-policy RL for language models acting in multi-turn, tool-calling
environments. Importing it registers the built-in Gymnasium environments
(:mod:`agentrl.registration`: ids only, no heavy import).

The Python API (:mod:`agentrl.api`, imported on first use): ``agentrl.train(recipe, **overrides)``
-> RunSummary, ``agentrl.check(recipe, dry_run=False)`` -> bool, ``agentrl.evaluate(recipe,
checkpoint)`` (also ``agentrl.eval``) -> RunSummary, ``agentrl.load(recipe)`` -> Recipe."""

from typing import Any

from agentrl.registration import register_builtin_envs

register_builtin_envs()


_API = {"train": "train", "check": "check", "evaluate": "evaluate", "eval": "evaluate", "load": "load"}


def __getattr__(name: str) -> Any:
    """``agentrl.train`` and the rest of :mod:`agentrl.api`, imported when first used (``import
    agentrl`` stays light)."""
    if name in _API:
        from agentrl import api

        return getattr(api, _API[name])
    raise AttributeError(f"module 'agentrl' has no attribute {name!r}")
