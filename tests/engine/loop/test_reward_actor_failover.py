"""Reward actor failover over the shipped fakes (agentrl.engine.testing): a separate judge's
generator or the reward model's actor that dies mid-run is replaced with the same settings and
handed to every rollout worker; the episodes it was scoring are infrastructure failures (never a
reward of 0), their groups re-issued as new groups without counting as a broken rollout; the
replacements are bounded and said in words."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest

from agentrl.engine.testing import FakeRun, KillRewardActor
from agentrl.errors import InfraError, RewardModelError

ROWS = [{"reward": float(i % 2)} for i in range(200)]
#: 8 groups a batch and a staleness bound of 1: up to 16 groups in flight, each being scored when
#: the actor dies: more lost groups than the ledger's ``max_lost_in_a_row`` (8).
BIG = {"batch_size": 16, "group_size": 2, "max_staleness": 1, "worker": {"delay_s": lambda idx: 0.02}}


def events(run: FakeRun) -> list[dict]:
    return [r for r in map(json.loads, run.run_dir.metrics.read_text().splitlines()) if r["kind"] == "event"]


def assert_run_whole(run: FakeRun, loop, part: str) -> None:
    """Each prompt trained once; every trained episode was scored by ``part``; nothing abandoned."""
    prompts = [p for line in map(json.loads, run.run_dir.trained.read_text().splitlines()) for p in line["prompts"]]
    assert len(prompts) == len(set(prompts)), Counter(prompts).most_common(3)
    ids = [i for _, step_ids in run.trained for i in step_ids]
    assert len(ids) == len(set(ids))
    episodes = {t.sample_id: t for w in run.fleet.workers for t in w.obj.episodes}
    assert all(part in episodes[i].metrics for i in ids if i in episodes)
    assert loop.ledger.abandoned == []


@pytest.mark.parametrize(("which", "name", "metric", "part"), [
    ("judge", "judge generator 0", "judge_generator_restarts", "judge_score"),
    ("reward_model", "reward model", "reward_model_restarts", "rm_score"),
])
def test_a_dead_reward_actor_is_replaced_and_the_groups_it_was_scoring_reissued(tmp_path, which, name, metric, part):
    kill = KillRewardActor(after_step=2, which=which)
    run = FakeRun(tmp_path, rows=ROWS, max_steps=5, judges=1 if which == "judge" else 0, reward_model=which == "reward_model", **BIG)
    run.hooks.append(kill)
    loop = asyncio.run(run.run())
    assert loop.version == 5
    restarts = [e for e in events(run) if e.get(metric)]
    assert len(restarts) == 1, restarts
    assert restarts[0]["message"].startswith(f"{name} died (killed by the test (SIGKILL)); replaced by a new one, the episodes it was scoring"), restarts
    assert f"{name} died (killed by the test" in run.console.getvalue()  # one plain line on the console
    dead = kill.killed[0]
    new = run.rewards.judge_generators[0] if which == "judge" else run.rewards.reward_model
    assert new is not dead and not new.dead
    for w in run.fleet.workers:  # every rollout worker was handed the new one
        held = w.obj.judge_generators[0] if which == "judge" else w.obj.reward_model
        assert held is new
    # the episodes being scored when it died: infrastructure failures, their environment reward kept, never a 0 written
    failed = [t for w in run.fleet.workers for t in w.obj.episodes if t.info.get("reward_failure") == which]
    assert failed and all(t.status == "infra_failure" and part not in t.metrics for t in failed)
    assert all(t.reward == float(ROWS[t.prompt_index]["reward"]) for t in failed)
    lost_lines = [m for m in (e["message"] for e in events(run)) if m.startswith("group ") and m.endswith("re-issued")]
    assert lost_lines and all(m.endswith(f"failed on infrastructure (its {name.removesuffix(' 0')} died); re-issued") for m in lost_lines), lost_lines
    assert len(lost_lines) > 8  # more than max_lost_in_a_row: one death is not a broken rollout
    assert not {t.sample_id for t in failed} & {i for _, ids in run.trained for i in ids}
    assert_run_whole(run, loop, part)


def test_without_replacement_a_dead_judge_stops_the_run(tmp_path):
    """The control: the same kill with no replacement loses every later group."""
    run = FakeRun(tmp_path, rows=ROWS, max_steps=5, judges=1, reward_restarts=None, **BIG)
    run.hooks.append(KillRewardActor(after_step=2, which="judge", handles=lambda: run.rewards.judge_generators))
    with pytest.raises(InfraError, match="rollout keeps failing"):
        asyncio.run(run.run())


def test_reward_actor_replacements_are_bounded_and_said_in_words(tmp_path):
    run = FakeRun(tmp_path, rows=ROWS, max_steps=5, reward_model=True, reward_restarts=0,
                  hooks=[KillRewardActor(after_step=2, which="reward_model")], **BIG)
    with pytest.raises(RewardModelError, match=r"^reward model died \(killed by the test .* after 0 replacements in this run "
                                               r"\(reward.model.max_restarts = 0; raise it, or rerun the same command"):
        asyncio.run(run.run())
    assert run.reward_actors_made == 1
