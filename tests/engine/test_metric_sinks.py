"""Metric sinks: TensorBoard scalars and a real (offline) Weights & Biases run."""

import time

import pytest
import wandb  # noqa: F401  imported at collection, while this process has one thread: see below

# wandb's import parses class sources (pydantic's field docstrings, ast.parse). CPython 3.11 keeps
# the AST constructor's recursion counter per interpreter, so a parse while another thread parses
# can fail with "SystemError: AST constructor recursion depth mismatch" (python/cpython#106905):
# seen once in the parallel tier, importing wandb inside the test after other tests' threads.

from agentrl.engine.metric_sinks import numeric_fields
from agentrl.engine.metrics import MetricsLogger


def test_numeric_fields_keep_numbers_only() -> None:
    rec = {"a": 1, "b": 0.5, "flag": True, "name": "x", "hist": {"0": 3}}
    assert numeric_fields(rec) == {"a": 1, "b": 0.5}


def test_tensorboard_scalars_per_kind(tmp_path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log = MetricsLogger(tmp_path, live=False)
    log.log("sft", step=25, sft_loss=2.0)
    log.step(step=1, version=1, reward_mean=0.25)
    log.step(step=2, version=2, reward_mean=0.5)
    log.event("not a scalar")
    log.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("step/reward_mean")] == [(1, 0.25), (2, 0.5)]
    assert [(e.step, e.value) for e in acc.Scalars("sft/sft_loss")] == [(25, 2.0)]


@pytest.mark.timeout(300)
def test_wandb_offline_run(tmp_path, monkeypatch) -> None:
    from agentrl.engine.metric_sinks import WandbSink

    monkeypatch.setenv("WANDB_SILENT", "true")
    sink = WandbSink(project="agentrl-test", directory=tmp_path, name="t", config={"lr": 1e-4}, mode="offline", tags=["ci"])
    log = MetricsLogger(tmp_path, live=False, sinks=[sink])
    log.log("sft", step=25, sft_loss=2.0)
    log.step(step=1, version=1, reward_mean=0.25, staleness_hist={"0": 8})
    log.step(step=2, version=2, reward_mean=0.75)
    log.close()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, list((tmp_path / "wandb").iterdir())
    (data_file,) = runs[0].glob("run-*.wandb")  # the run's records, for `wandb sync`
    # `finish` only informs W&B's service process that the run ended; the service writes out and
    # closes the run's file after that, on its own time (seen in CI: the header alone, just after).
    deadline = time.monotonic() + 60
    while b"step/reward_mean" not in (data := data_file.read_bytes()) and time.monotonic() < deadline:
        time.sleep(0.2)
    # protobuf records: keys and JSON values are stored verbatim
    for key in (b"step/reward_mean", b"step/step", b"sft/sft_loss", b"sft/step", b"agentrl-test"):
        assert key in data, key
    assert b"0.75" in data and b"staleness_hist" not in data  # numbers only


def test_wandb_recipe_section_validates() -> None:
    from agentrl.config import Recipe

    r = Recipe.model_validate({"model": {"path": "m"}, "wandb": {"project": "p", "mode": "offline"}})
    assert r.wandb.project == "p" and r.wandb.mode == "offline"
    with pytest.raises(Exception, match="mode"):
        Recipe.model_validate({"model": {"path": "m"}, "wandb": {"mode": "sometimes"}})
