"""PPO's critic failover over the shipped fakes (agentrl.engine.testing): a critic rank that dies
mid-run is restarted together with the learner from the newest checkpoint (the checkpoint holds
the critic's state in ``critic/``), and the run goes on with each prompt trained once; without a
checkpoint, or with the restarts spent, the run stops with words that name the critic and what
to do."""

from __future__ import annotations

import asyncio
import json

import pytest

from agentrl.engine.loop.run_state import latest_checkpoint
from agentrl.engine.common.cluster import kill
from agentrl.engine.testing import FakeRun, KillLearner
from agentrl.errors import LearnerError

ROWS = [{"reward": float(i % 2)} for i in range(200)]


def events(run: FakeRun) -> list[dict]:
    return [r for r in map(json.loads, run.run_dir.metrics.read_text().splitlines()) if r["kind"] == "event"]


def trained_prompts(run: FakeRun) -> list[int]:
    return [p for line in map(json.loads, run.run_dir.trained.read_text().splitlines()) for p in line["prompts"]]


def test_a_dead_critic_rank_restarts_with_the_learner_from_the_checkpoint(tmp_path):
    run = FakeRun(tmp_path, rows=ROWS, max_steps=6, checkpoint_every=2, max_restarts=1, critic={"value": 0.25},
                  hooks=[KillLearner(after_step=3, critic=True)])
    started: list[object] = []
    start = run.critic.start

    async def counting_start(*args, **kwargs):
        out = await start(*args, **kwargs)
        started.append(run.critic.handles[0])
        return out

    run.critic.start = counting_start  # type: ignore[method-assign]
    loop = asyncio.run(run.run())
    assert loop.version == 6
    assert len(started) == 2 and started[0] is not started[1]  # the critic's ranks were started anew
    restarts = [e for e in events(run) if e.get("critic_restarts")]
    assert len(restarts) == 1, restarts
    message = restarts[0]["message"]
    assert message.startswith("critic rank 0 died during critic values for step 4"), message
    assert "restarting the learner and the critic from checkpoint step_000002" in message
    assert restarts[0]["learner_restarts"] == 1  # one bound for both: learner.max_restarts
    # both went back to step 2: the steps after it were trained again, by the learner and by the critic
    assert [s for s, _ in run.trained] == [1, 2, 3, 3, 4, 5, 6]
    assert [s for s, _, _ in run.critic_seen] == [1, 2, 3, 3, 4, 5, 6]
    assert json.loads((latest_checkpoint(tmp_path) / "critic" / "trainer_state.json").read_text())["step"] == 4
    # nothing trained twice, nothing lost
    prompts = trained_prompts(run)
    assert [line["step"] for line in map(json.loads, run.run_dir.trained.read_text().splitlines())] == [1, 2, 3, 4, 5, 6]
    assert len(prompts) == len(set(prompts))
    accounted = set(prompts) | set(loop.ledger.untrained(loop.queue)) | set(loop.queue.stats.dropped_prompts)
    assert accounted == set(range(loop.ledger.cursor))


def test_a_critic_death_without_a_checkpoint_names_the_critic_and_what_to_do(tmp_path):
    run = FakeRun(tmp_path, rows=ROWS, max_steps=4, max_restarts=2, critic={"value": 0.25}, hooks=[KillLearner(after_step=1, critic=True)])
    with pytest.raises(LearnerError, match=r"^critic rank 0 died during critic values for step 2: .*no checkpoint to restart "
                                           r"the learner and the critic from yet.*rerunning the same `agentrl train` command"):
        asyncio.run(run.run())


def test_critic_restarts_share_the_learners_bound(tmp_path):
    run = FakeRun(tmp_path, rows=ROWS, max_steps=6, checkpoint_every=2, max_restarts=0, critic={"value": 0.25},
                  hooks=[KillLearner(after_step=3, critic=True)])
    with pytest.raises(LearnerError, match=r"^critic rank 0 died .*already restarted 0 time\(s\) \(learner.max_restarts = 0\).*step_000002"):
        asyncio.run(run.run())


def test_a_learner_and_a_critic_rank_dying_at_once_restart_together(tmp_path):
    """Two at once, both found by the step after: one restart brings both back."""
    kills = [KillLearner(after_step=3), KillLearner(after_step=3, critic=True)]
    run = FakeRun(tmp_path, rows=ROWS, max_steps=6, checkpoint_every=2, max_restarts=1, critic={"value": 0.25}, hooks=kills)
    loop = asyncio.run(run.run())
    assert loop.version == 6
    assert [e.get("critic_restarts") for e in events(run) if e.get("learner_restarts")] == [1]
    prompts = trained_prompts(run)
    assert len(prompts) == len(set(prompts))


def test_a_critic_rank_dying_during_the_learners_restart_is_restarted_too(tmp_path):
    """The learner died; while the critic is rewound to the checkpoint, a critic rank dies: the
    restart is made again (counted against the same bound) and the run goes on."""
    run = FakeRun(tmp_path, rows=ROWS, max_steps=6, checkpoint_every=2, max_restarts=2, critic={"value": 0.25},
                  hooks=[KillLearner(after_step=3)])
    call = run.critic.call
    dying = [True]

    async def call_then_die(method, *args, **kwargs):
        if method == "load_checkpoint" and dying:
            dying.clear()
            kill(run.critic.handles[0])
        return await call(method, *args, **kwargs)

    run.critic.call = call_then_die  # type: ignore[method-assign]
    loop = asyncio.run(run.run())
    assert loop.version == 6 and not dying
    restarts = [e for e in events(run) if e.get("learner_restarts")]
    assert [bool(e.get("critic_restarts")) for e in restarts] == [False, True], restarts
    assert restarts[1]["message"].startswith("critic rank 0 died during loading the critic checkpoint")
    prompts = trained_prompts(run)
    assert len(prompts) == len(set(prompts))
