"""Shared fixtures: one tiny calculator model per test session."""

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_calc_model(tmp_path_factory) -> Path:
    """A tiny Qwen2 + tokenizer trained on calculator text, as a Hugging Face folder."""
    from agentrl.envs.corpus import tokenizer_corpus
    from agentrl.envs.data import load_rows
    from agentrl.models.tiny import build_tiny_model

    out = tmp_path_factory.mktemp("models") / "tiny-calc"
    rows = load_rows("synthetic:calc", limit=500)
    return Path(build_tiny_model(out, tokenizer_corpus("agentrl/Calc-v0", rows)))
