"""Checkpoints written in the background (``checkpoint.background``) over the shipped fakes: a
checkpoint is put in place as soon as the ranks wrote it, at the latest after the learner step
that follows it, never half-written; a learner that dies while one is being written restarts
from the previous one; a loop that stops on an error puts the one being written in place."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from agentrl.engine.loop.run_state import latest_checkpoint, read_state, truncate_logs
from agentrl.engine.testing import FakeRun, KillLearner
from tests.engine.loop.test_loop import ROWS, assert_each_prompt_once, events, trained_lines


class SeeCheckpoints:
    """Loop hook: the names in ``checkpoints/`` (one being written is hidden) after each step
    (``seen``, by version)."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, list[str]]] = []

    @staticmethod
    def _names(loop: Any) -> list[str]:
        root = loop.run_dir.checkpoints
        return sorted(p.name for p in root.iterdir()) if root.is_dir() else []

    async def on_round(self, loop: Any) -> None:
        return None

    async def after_step(self, loop: Any) -> None:
        self.seen.append((loop.version, self._names(loop)))


class FailAfter:
    """Loop hook: raise after step ``step`` (an error that is not a rank's death)."""

    def __init__(self, step: int) -> None:
        self.step = step

    async def on_round(self, loop: Any) -> None:
        return None

    async def after_step(self, loop: Any) -> None:
        if loop.version >= self.step:
            raise RuntimeError("the run stops here")


class WatchDuringNextStep:
    """Loop hook: after step ``step``, watch ``checkpoints/`` (every 20 ms) while the next step
    trains, until the fake learner recorded it in ``trained`` (the run's list: set it after the
    run is made); ``appeared``: the names once the checkpoint of ``step`` was there, None if it
    never was while that step trained."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.trained: list[tuple[int, list[str]]] = []
        self.appeared: list[str] | None = None
        self.task: asyncio.Task[None] | None = None

    async def on_round(self, loop: Any) -> None:
        return None

    async def after_step(self, loop: Any) -> None:
        if loop.version == self.step and self.task is None:
            self.task = asyncio.ensure_future(self._watch(loop))

    async def _watch(self, loop: Any) -> None:
        name = f"step_{self.step:06d}"
        while loop.version == self.step and not any(s == self.step + 1 for s, _ in self.trained):
            names = SeeCheckpoints._names(loop)
            if name in names:
                self.appeared = names
                return
            await asyncio.sleep(0.02)


def test_a_background_checkpoint_is_in_place_as_soon_as_written_while_the_next_step_trains(tmp_path):
    see, watch = SeeCheckpoints(), WatchDuringNextStep(2)
    slow = {"worker": {"delay_s": lambda idx: 0.05}, "learner": {"step_delay_s": 1.0, "background_write_s": 0.05}}
    run = FakeRun(tmp_path, rows=ROWS, max_steps=3, checkpoint_every=2, background_checkpoints=True, hooks=[see, watch], **slow)
    watch.trained = run.trained
    asyncio.run(run.run())
    assert dict(see.seen)[2] == [".step_000002.tmp"]  # right after the save: being written
    # during step 3's second of training (the loop still at version 2), once written
    assert watch.appeared == ["step_000002"], watch.appeared
    [event] = [e["message"] for e in events(run) if e["message"].startswith("checkpoint step_000002")]
    assert "written in the background" in event


def test_a_background_checkpoint_whose_write_outlasts_the_next_step_is_in_place_after_it_and_resumes(tmp_path):
    see, watch = SeeCheckpoints(), WatchDuringNextStep(2)
    slow = {"worker": {"delay_s": lambda idx: 0.05}, "learner": {"step_delay_s": 0.03}}  # writes end at finish_checkpoint
    first = FakeRun(tmp_path, rows=ROWS, max_steps=5, checkpoint_every=2, background_checkpoints=True, hooks=[see, watch], **slow)
    watch.trained = first.trained
    asyncio.run(first.run())
    assert watch.task is not None and watch.appeared is None  # not while step 3 trained
    # checkpoint 2 is written while step 3 trains: hidden after step 2, in place from step 3 on
    by_step = dict(see.seen)
    assert by_step[2] == [".step_000002.tmp"]
    assert by_step[3] == ["step_000002"]
    assert by_step[4] == [".step_000004.tmp", "step_000002"]
    # the loop's end puts the last one in place; nothing hidden is left
    assert sorted(p.name for p in first.run_dir.checkpoints.iterdir()) == ["step_000002", "step_000004"]
    ckpt = latest_checkpoint(tmp_path)
    assert ckpt is not None and ckpt.name == "step_000004"
    assert json.loads((ckpt / "learner" / "trainer_state.json").read_text())["step"] == 4  # the state at the save
    written = [e["message"] for e in events(first) if e["message"].startswith("checkpoint step_")]
    assert len(written) == 2 and all("written in the background" in m for m in written), written
    state = read_state(ckpt)
    truncate_logs(tmp_path, state.version)
    second = FakeRun(tmp_path, rows=ROWS, max_steps=7, checkpoint_every=2, background_checkpoints=True, **slow)
    loop = asyncio.run(second.run(state))
    assert [line["step"] for line in trained_lines(second)] == [1, 2, 3, 4, 5, 6, 7]
    prompts = assert_each_prompt_once(second)
    accounted = set(prompts) | set(loop.ledger.untrained(loop.queue)) | set(loop.queue.stats.dropped_prompts)
    assert accounted == set(range(loop.ledger.cursor))


def test_a_learner_dying_while_a_checkpoint_is_written_restarts_from_the_previous_one(tmp_path):
    # checkpoint 4 is being written when the learner dies (after step 4, before step 5 ends):
    # the restart goes back to checkpoint 2, the complete one, and the half-written one is gone
    run = FakeRun(tmp_path, rows=ROWS, max_steps=7, checkpoint_every=2, max_restarts=1, background_checkpoints=True,
                  hooks=[KillLearner(after_step=4)])
    loop = asyncio.run(run.run())
    assert loop.version == 7
    restarts = [e for e in events(run) if e.get("learner_restarts")]
    assert len(restarts) == 1 and "restarting the learner from checkpoint step_000002" in restarts[0]["message"], restarts
    assert [s for s, _ in run.trained] == [1, 2, 3, 4, 3, 4, 5, 6, 7]  # steps 3 and 4 trained again after the restart
    assert_each_prompt_once(run)
    assert not [p.name for p in run.run_dir.checkpoints.iterdir() if p.name.startswith(".")]
    assert latest_checkpoint(tmp_path).name == "step_000006"


def test_a_loop_stopping_on_an_error_puts_the_checkpoint_being_written_in_place(tmp_path):
    run = FakeRun(tmp_path, rows=ROWS, max_steps=8, checkpoint_every=3, background_checkpoints=True, hooks=[FailAfter(3)])
    with pytest.raises(RuntimeError, match="the run stops here"):
        asyncio.run(run.run())
    ckpt = latest_checkpoint(tmp_path)
    assert ckpt is not None and ckpt.name == "step_000003"  # saved at step 3, the error came before step 4
    assert json.loads((ckpt / "learner" / "trainer_state.json").read_text())["step"] == 3
    assert not [p.name for p in run.run_dir.checkpoints.iterdir() if p.name.startswith(".")]
