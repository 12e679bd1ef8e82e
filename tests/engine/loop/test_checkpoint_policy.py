"""Checkpoints by default: the recipe's default policy (after step 1, every 10 minutes, at each
mid-run evaluation) reaches the loop, makes every shipped recipe checkpoint, and makes a learner
that dies early restartable (failover) without any checkpoint key in the recipe."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from types import SimpleNamespace

from agentrl.config import load_recipe
from agentrl.engine import wiring
from agentrl.engine.loop.loop import LoopSettings, RLLoop
from agentrl.engine.loop.run_state import latest_checkpoint
from agentrl.engine.testing import FakeRun, KillLearner

ROWS = [{"reward": float(i % 2)} for i in range(100)]
RECIPES = sorted(Path(__file__).resolve().parents[3].joinpath("recipes").glob("*.toml"))


def _due(settings: LoopSettings, version: int, *, now: float, last: float = 0.0, evaluate: object = None) -> bool:
    loop = SimpleNamespace(settings=settings, clock=lambda: now, _last_checkpoint_t=last, evaluate=evaluate)
    return RLLoop._checkpoint_due(loop, version)  # type: ignore[arg-type]


def test_the_default_policy_reaches_the_loop_settings():
    s = wiring.loop_settings(load_recipe(RECIPES[0]))
    assert (s.checkpoint_every_s, s.checkpoint_first_step, s.checkpoint_at_eval) == (600.0, True, True)


def test_every_shipped_recipe_checkpoints_after_step_one_without_asking():
    assert RECIPES
    for path in RECIPES:
        s = wiring.loop_settings(load_recipe(path))
        assert _due(s, 1, now=0.0), path.name


def test_a_checkpoint_is_due_by_time_by_evaluation_and_by_step_count():
    s = LoopSettings(max_steps=100, group_size=2, episode_timeout_s=1, stuck_timeout_s=1, checkpoint_every_s=600.0)
    assert not _due(s, 5, now=599.0)
    assert _due(s, 5, now=600.0)
    assert not _due(s, 7, now=900.0, last=600.0)  # the clock runs from the previous checkpoint
    ev = dataclasses.replace(s, eval_every=4, checkpoint_at_eval=True)
    assert _due(ev, 8, now=1.0, evaluate=object()) and not _due(ev, 9, now=1.0, evaluate=object())
    assert not _due(ev, 8, now=1.0, evaluate=None)  # no evaluation, no checkpoint for it
    steps = dataclasses.replace(s, checkpoint_every_s=0.0, checkpoint_every=3)
    assert _due(steps, 6, now=0.0) and not _due(steps, 7, now=1e9)


def test_with_the_default_policy_a_learner_that_dies_at_step_two_is_restarted_from_step_one(tmp_path):
    defaults = wiring.loop_settings(load_recipe(RECIPES[0]))
    run = FakeRun(tmp_path, rows=ROWS, max_steps=5, max_restarts=1, hooks=[KillLearner(after_step=2)])
    run.settings = dataclasses.replace(
        run.settings, checkpoint_every_s=defaults.checkpoint_every_s, checkpoint_first_step=defaults.checkpoint_first_step,
        checkpoint_at_eval=defaults.checkpoint_at_eval,
    )
    loop = asyncio.run(run.run())
    assert loop.version == 5
    assert [s for s, _ in run.trained] == [1, 2, 2, 3, 4, 5]  # step 2 trained again after the restart from step 1
    assert latest_checkpoint(tmp_path).name == "step_000001"
