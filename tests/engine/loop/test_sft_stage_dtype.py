"""The SFT stage writes its model in the recipe's model dtype (the learner's serving dtype:
bfloat16 on GPUs), not the float32 master weights: the learner ranks are in-process doubles
that write a folder stating the dtype they were asked for (the real learner's ``publish`` casts
shard by shard before the gather: tests/engine/generation/test_weight_transfer_gpu_seams.py)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from agentrl.engine.loop import sft_stage
from agentrl.engine.testing import local_actor
from agentrl.engine.training.learner_group import LearnerGroup


class SftLearner:
    """A learner rank as the SFT stage drives it; ``publish`` writes ``config.json`` with the
    dtype it would write the weights in."""

    def __init__(self, dtype: str) -> None:
        self.dtype = dtype

    def setup(self) -> dict[str, Any]:
        return {}

    def sft_step(self, batch: list[Any]) -> dict[str, Any]:
        return {"sft_loss": 1.0, "lr": 1e-5, "trained_tokens": 4.0}

    def publish(self, out_dir: str, with_tokenizer: bool = False, serving_dtype: bool = False, merged: bool = False) -> str:
        Path(out_dir).mkdir(parents=True)
        (Path(out_dir) / "config.json").write_text(json.dumps({"torch_dtype": self.dtype if serving_dtype else "float32"}))
        return out_dir

    def shutdown(self) -> None:
        return None


class Log:
    class console:  # noqa: N801 - the MetricsLogger's attribute
        @staticmethod
        def print(text: str) -> None:
            return None

    def event(self, text: str) -> None:
        return None

    def log(self, kind: str, **record: Any) -> dict[str, Any]:
        return {"time": 0.0, **record}


def test_the_sft_model_is_written_in_the_model_dtype_not_float32(monkeypatch, tmp_path):
    import agentrl.models.loading as loading

    monkeypatch.setattr(loading, "load_tokenizer", lambda name: None)
    monkeypatch.setattr(sft_stage, "load_conversations", lambda source, n, seed: [{"messages": []}] * n)
    monkeypatch.setattr(sft_stage, "encode_chat", lambda tok, c: {"tokens": [1, 2], "loss_mask": [0, 1]})
    learners = LearnerGroup(num_ranks=1, placement=None, timeout_s=30.0,
                            factory=lambda rank, kwargs, options: local_actor(SftLearner("bfloat16"), f"learner {rank}"))
    out = tmp_path / "sft"
    written = asyncio.run(sft_stage.run_sft(learners, {}, model="m", out=out, source="s", num_examples=4, steps=2,
                                            batch_size=2, seed=0, log=Log()))
    assert written == str(out)
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16", "the SFT model was written in float32"


def _stage(monkeypatch, tmp_path, learners: LearnerGroup, log: Any, max_restarts: int) -> str:
    import agentrl.models.loading as loading

    monkeypatch.setattr(loading, "load_tokenizer", lambda name: None)
    monkeypatch.setattr(sft_stage, "load_conversations", lambda source, n, seed: [{"messages": []}] * n)
    monkeypatch.setattr(sft_stage, "encode_chat", lambda tok, c: {"tokens": [1, 2], "loss_mask": [0, 1]})
    return asyncio.run(sft_stage.run_sft(learners, {}, model="/start", out=tmp_path / "sft", source="s", num_examples=8,
                                         steps=4, batch_size=2, seed=0, log=log, max_restarts=max_restarts))


class Events(Log):
    def __init__(self) -> None:
        self.events: list[str] = []

    def event(self, text: str, **fields: Any) -> None:
        self.events.append(text)


def test_a_learner_death_during_sft_restarts_the_stage_from_the_model(monkeypatch, tmp_path):
    """The first learner dies in its third step: a new one runs all four steps from the start
    model, and the stage's model is written; the restart is one event in words."""
    ranks: list[Any] = []
    steps: list[tuple[int, int]] = []

    class Dying(SftLearner):
        def sft_step(self, batch: list[Any]) -> dict[str, Any]:
            steps.append((len(ranks), len(steps)))
            if len(ranks) == 1 and len(steps) == 3:
                ranks[0].kill()
            return super().sft_step(batch)

    def factory(rank: int, kwargs: dict[str, Any], options: dict[str, Any]) -> Any:
        ranks.append(local_actor(Dying("float32"), f"learner {rank}"))
        return ranks[-1]

    log = Events()
    out = _stage(monkeypatch, tmp_path, LearnerGroup(num_ranks=1, placement=None, timeout_s=30.0, factory=factory), log, 1)
    assert out == str(tmp_path / "sft") and (tmp_path / "sft" / "config.json").is_file()
    assert len(ranks) == 2 and [n for n, _ in steps].count(2) == 4  # the second learner ran the whole stage
    [restart] = [e for e in log.events if "restarting the SFT stage" in e]
    assert "learner rank 0 died during SFT step 3" in restart and "from /start at step 0 (restart 1 of 1)" in restart


def test_sft_restarts_are_bounded(monkeypatch, tmp_path):
    from agentrl.errors import LearnerDied

    class AlwaysDying(SftLearner):
        def sft_step(self, batch: list[Any]) -> dict[str, Any]:
            handles[-1].kill()
            return super().sft_step(batch)

    handles: list[Any] = []

    def factory(rank: int, kwargs: dict[str, Any], options: dict[str, Any]) -> Any:
        handles.append(local_actor(AlwaysDying("float32"), f"learner {rank}"))
        return handles[-1]

    learners = LearnerGroup(num_ranks=1, placement=None, timeout_s=30.0, factory=factory)
    try:
        _stage(monkeypatch, tmp_path, learners, Events(), 1)
    except LearnerDied as died:
        assert "died during SFT step 1" in str(died) and len(handles) == 2
    else:
        raise AssertionError("a learner that keeps dying must end the stage")


def demonstrations_with_their_own_loop(n: int, seed: int = 0) -> list[list[dict[str, str]]]:
    """An SFT source that plays its conversations in an event loop of its own (as
    agentrl.envs.math_demos:tool_demonstrations does through its environment)."""
    import anyio

    async def main() -> list[list[dict[str, str]]]:
        return [[{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"}] for i in range(n)]

    return anyio.run(main)


def test_a_source_that_runs_its_own_event_loop_works_inside_the_running_stage(monkeypatch, tmp_path):
    import agentrl.models.loading as loading

    monkeypatch.setattr(loading, "load_tokenizer", lambda name: None)
    seen: list[Any] = []
    monkeypatch.setattr(sft_stage, "encode_chat", lambda tok, c: seen.append(c) or {"tokens": [1, 2], "loss_mask": [0, 1]})
    learners = LearnerGroup(num_ranks=1, placement=None, timeout_s=30.0,
                            factory=lambda rank, kwargs, options: local_actor(SftLearner("float32"), f"learner {rank}"))
    asyncio.run(sft_stage.run_sft(learners, {}, model="m", out=tmp_path / "sft", source=f"{__name__}:demonstrations_with_their_own_loop",
                                  num_examples=3, steps=1, batch_size=2, seed=0, log=Log()))
    assert [c[0]["content"] for c in seen] == ["q0", "q1", "q2"]


def test_a_source_that_raises_is_a_data_error_naming_it():
    import pytest

    from agentrl.engine.training.sft import load_conversations
    from agentrl.errors import DataError

    with pytest.raises(DataError, match=r"SFT source 'tests.engine.loop.test_sft_stage_dtype:demonstrations_with_their_own_loop' raised RuntimeError"):
        asyncio.run(_in_a_loop(load_conversations, "tests.engine.loop.test_sft_stage_dtype:demonstrations_with_their_own_loop"))


async def _in_a_loop(fn: Any, source: str) -> Any:
    return fn(source, 2, 0)  # called on the loop's own thread: anyio.run refuses
