"""Text to train a tiny model's tokenizer on: the task's own prompts, answers and episodes."""

from __future__ import annotations

import importlib
from typing import Any

import gymnasium


def _env_module(env_id: str) -> Any:
    """The module that defines the environment ``env_id`` (a registered id or ``module:Class``),
    or the agent program ``module:function``."""
    import agentrl.envs  # noqa: F401  (registers the built-in environments)

    if ":" in env_id and env_id not in gymnasium.registry:
        return importlib.import_module(env_id.split(":", 1)[0])
    entry = gymnasium.registry[env_id].entry_point
    if callable(entry):
        return importlib.import_module(entry.__module__)
    return importlib.import_module(str(entry).split(":", 1)[0])


def tokenizer_corpus(env_id: str, rows: list[dict[str, Any]], *, seed: int = 0, n_texts: int = 2000) -> list[str]:
    """Texts for tokenizer training: every row's fields as text, plus whole example episodes when
    the environment's (or agent's) module offers ``sample_texts(n, seed)``."""
    texts = [" ".join(str(v) for v in row.values()) for row in rows[:n_texts]]
    try:
        module = _env_module(env_id)
    except Exception:
        module = None
    sample = getattr(module, "sample_texts", None)
    if callable(sample):
        texts.extend(sample(n_texts, seed))
    return texts
