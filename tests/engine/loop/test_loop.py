"""The RL loop, the ledger, the fleet and learner failover over the shipped fakes
(agentrl.engine.testing): no Ray, no vLLM, no torch.distributed; seconds."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest

from agentrl.engine.loop.run_state import latest_checkpoint, read_state, truncate_logs
from agentrl.engine.testing import FakeRun, KillGenerator, KillLearner
from agentrl.errors import InfraError, LearnerError

ROWS = [{"reward": float(i % 2)} for i in range(100)]


def trained_lines(run: FakeRun) -> list[dict]:
    return [json.loads(line) for line in run.run_dir.trained.read_text().splitlines()]


def events(run: FakeRun) -> list[dict]:
    return [r for r in map(json.loads, run.run_dir.metrics.read_text().splitlines()) if r["kind"] == "event"]


def assert_each_prompt_once(run: FakeRun) -> list[int]:
    prompts = [p for line in trained_lines(run) for p in line["prompts"]]
    assert len(prompts) == len(set(prompts)), Counter(prompts).most_common(3)
    return prompts


def test_trains_every_step_in_prompt_order_within_the_staleness_bound(tmp_path):
    run = FakeRun(tmp_path, rows=ROWS, max_steps=4, max_staleness=1)
    loop = asyncio.run(run.run())
    assert loop.version == 4
    assert [line["step"] for line in trained_lines(run)] == [1, 2, 3, 4]
    prompts = assert_each_prompt_once(run)
    assert len(prompts) == 4 * 2  # 4 samples per step = 2 groups of 2
    # the learner got every sample of those groups, once
    ids = [i for _, step_ids in run.trained for i in step_ids]
    assert len(ids) == len(set(ids)) == 16
    steps = [r for r in map(json.loads, run.run_dir.metrics.read_text().splitlines()) if r["kind"] == "step"]
    for s in steps:
        assert all(int(k) <= 1 for k in s["staleness_hist"]), s["staleness_hist"]
    # admission: never more than (version + max_staleness + 1) batches started
    assert loop.queue.stats.started <= (loop.version + 2) * 4
    # versions were published to disk and loaded by the generator, pruned to keep_versions
    assert run.run_dir.versions_on_disk() == [2, 3, 4]
    gen = run.fleet.generators[0].obj
    assert [v for v, _ in gen.loaded] == [1, 2, 3, 4]


def test_lost_groups_are_reissued_as_new_groups_and_abandoned_after_three_tries(tmp_path):
    run = FakeRun(
        tmp_path, rows=ROWS, max_steps=4,
        worker={"fail": lambda idx, gid: gid == "p1" or idx == 2},  # p1 fails once, p2 always
    )
    loop = asyncio.run(run.run())
    played = run.fleet.workers[0].obj.groups
    assert "p1" in played and "p1-1" in played
    assert [g for g in played if g.startswith("p2")] == ["p2", "p2-1", "p2-2"]
    assert loop.ledger.abandoned == [2]
    prompts = assert_each_prompt_once(run)
    assert 1 in prompts and 2 not in prompts
    messages = [e["message"] for e in events(run)]
    assert any("group p1 failed on infrastructure" in m and m.endswith("re-issued") for m in messages), messages
    assert any("group p2-2 failed" in m and m.endswith("abandoned") for m in messages), messages
    assert loop.ledger.infra_failures == 2 + 3 * 2


def test_a_rollout_that_keeps_failing_stops_the_run_in_words(tmp_path):
    run = FakeRun(tmp_path, rows=ROWS, max_steps=2, worker={"fail": lambda idx, gid: True})
    with pytest.raises(InfraError, match="rollout keeps failing"):
        asyncio.run(run.run())


def test_over_stale_groups_are_dropped_never_trained(tmp_path):
    # prompt 0's episodes linger long after their tokens were written at version 0: by the time
    # they finish the learner is 2+ versions on (max_staleness 1)
    run = FakeRun(
        tmp_path, rows=ROWS, max_steps=5, max_staleness=1,
        worker={"delay_s": lambda idx: 0.5 if idx == 0 else 0.0}, learner={"step_delay_s": 0.2},
    )
    loop = asyncio.run(run.run())
    assert loop.queue.stats.dropped_prompts == [0]
    assert loop.queue.stats.dropped_stale == 2
    assert 0 not in assert_each_prompt_once(run)
    assert not any(i.startswith("p0/") for _, ids in run.trained for i in ids)


def test_a_dead_generator_is_replaced_and_its_episodes_kept_out(tmp_path):
    run = FakeRun(tmp_path, rows=ROWS, max_steps=4, hooks=[KillGenerator(after_step=1)])
    loop = asyncio.run(run.run())
    assert loop.version == 4
    assert run.generators_made == 2
    messages = [e["message"] for e in events(run)]
    assert any(m.startswith("generator 0 restarted at version") for m in messages), messages
    assert loop.ledger.infra_failures > 0
    trained_ids = {i for _, ids in run.trained for i in ids}
    lost = {t.sample_id for t in run.fleet.workers[0].obj.episodes if not t.trainable}
    assert lost and not lost & trained_ids
    assert_each_prompt_once(run)


def test_resume_from_a_checkpoint_reissues_in_flight_prompts_and_trains_each_once(tmp_path):
    slow = {"worker": {"delay_s": lambda idx: 0.05}, "learner": {"step_delay_s": 0.03}}  # groups in flight at each step
    first = FakeRun(tmp_path, rows=ROWS, max_steps=5, checkpoint_every=2, **slow)
    asyncio.run(first.run())
    ckpt = latest_checkpoint(tmp_path)
    assert ckpt is not None and ckpt.name == "step_000004"
    state = read_state(ckpt)
    assert state.reissue, "groups were in flight at the checkpoint"
    # the process died after step 5: the resumed run goes on from step 4
    truncate_logs(tmp_path, state.version)
    second = FakeRun(tmp_path, rows=ROWS, max_steps=7, checkpoint_every=2, **slow)
    loop = asyncio.run(second.run(state))
    assert [line["step"] for line in trained_lines(second)] == [1, 2, 3, 4, 5, 6, 7]
    prompts = assert_each_prompt_once(second)
    for idx in state.reissue:  # in flight at the checkpoint: trained after the resume
        assert idx in prompts or idx in loop.ledger.untrained(loop.queue)
    # nothing below the cursor is lost: trained, waiting, or dropped as stale
    accounted = set(prompts) | set(loop.ledger.untrained(loop.queue)) | set(loop.queue.stats.dropped_prompts)
    assert accounted == set(range(loop.ledger.cursor))


def test_learner_failover_restarts_from_the_checkpoint_and_trains_each_prompt_once(tmp_path):
    run = FakeRun(tmp_path, rows=ROWS, max_steps=6, checkpoint_every=2, max_restarts=1, hooks=[KillLearner(after_step=3)])
    loop = asyncio.run(run.run())
    assert loop.version == 6
    assert [line["step"] for line in trained_lines(run)] == [1, 2, 3, 4, 5, 6]
    prompts = assert_each_prompt_once(run)
    accounted = set(prompts) | set(loop.ledger.untrained(loop.queue)) | set(loop.queue.stats.dropped_prompts)
    assert accounted == set(range(loop.ledger.cursor))
    # the dead learner's step 3 was trained again by the restarted one (from checkpoint 2)
    assert [s for s, _ in run.trained] == [1, 2, 3, 3, 4, 5, 6]
    restarts = [e for e in events(run) if e.get("learner_restarts")]
    assert len(restarts) == 1 and "learner rank 0 died" in restarts[0]["message"], restarts
    assert "restarting the learner from checkpoint step_000002" in restarts[0]["message"]
    # the generators serve the checkpoint's version again, then the new ones
    loaded = [v for v, _ in run.fleet.generators[0].obj.loaded]
    assert 2 in loaded[loaded.index(3):], loaded


def test_learner_death_without_a_checkpoint_is_an_error_in_words(tmp_path):
    run = FakeRun(tmp_path, rows=ROWS, max_steps=4, max_restarts=2, hooks=[KillLearner(after_step=1)])
    with pytest.raises(LearnerError, match=r"learner rank 0 died during learner step 2.*no checkpoint"):
        asyncio.run(run.run())


def test_a_learner_death_before_the_first_checkpoint_restarts_rl_from_its_starting_point(tmp_path):
    """No checkpoint yet (as during the first RL step of a run with default checkpoints): the
    learner restarts from the weights RL started from, at step 0, and every prompt is trained once."""
    run = FakeRun(tmp_path, rows=ROWS, max_steps=4, max_restarts=1, hooks=[KillLearner(after_step=1)], start_model="/start")
    loop = asyncio.run(run.run())
    assert loop.version == 4
    assert [line["step"] for line in trained_lines(run)] == [1, 2, 3, 4]
    assert_each_prompt_once(run)
    assert [s for s, _ in run.trained] == [1, 1, 2, 3, 4]  # the dead learner trained step 1 and died in step 2: the new one starts at 0
    restarts = [e for e in events(run) if e.get("learner_restarts")]
    assert len(restarts) == 1 and "no checkpoint yet: restarting the learner from the RL starting point at step 0" in restarts[0]["message"]
    loaded = run.fleet.generators[0].obj.loaded
    assert (0, "/start") in [(v, str(p)) for v, p in loaded], loaded  # the generators serve the starting weights again


def test_before_the_first_checkpoint_ppos_critic_restarts_at_step_0_with_the_learner(tmp_path):
    run = FakeRun(tmp_path, rows=ROWS, max_steps=3, max_restarts=1, hooks=[KillLearner(after_step=1)], start_model="/start", critic={})
    loop = asyncio.run(run.run())
    assert loop.version == 3
    assert_each_prompt_once(run)
    [restart] = [e for e in events(run) if e.get("learner_restarts")]
    assert restart["critic_restarts"] == 1 and "restarting the learner and the critic from the RL starting point" in restart["message"]


def test_learner_restarts_are_bounded(tmp_path):
    kills = [KillLearner(after_step=3), KillLearner(after_step=4)]  # the second kills the restarted learner
    run = FakeRun(tmp_path, rows=ROWS, max_steps=6, checkpoint_every=2, max_restarts=1, hooks=kills)
    with pytest.raises(LearnerError, match=r"already restarted 1 time.*step_000004.*agentrl train"):
        asyncio.run(run.run())


def test_degenerate_steps_are_said_in_words_and_stop_the_run(tmp_path):
    from agentrl.errors import DegenerateRun

    # every group of the fake worker shares its row's reward, 0 (all failed; all solved would be a
    # mastered task, a success): no learning signal in any step
    run = FakeRun(tmp_path, rows=[{"reward": 0.0}] * 40, max_steps=10, max_degenerate_steps=3)
    with pytest.raises(DegenerateRun, match="3 degenerate steps in a row .*equal rewards"):
        asyncio.run(run.run())
    steps = [r for r in map(json.loads, run.run_dir.metrics.read_text().splitlines()) if r["kind"] == "step"]
    assert [s["degenerate"] for s in steps] == [1.0, 1.0, 1.0]
    assert "step 1 is degenerate: every one of the 2 groups had equal rewards" in run.console.getvalue()
    # a step with a learning signal resets the count
    mixed = [{"reward": 1.0}] * 4 + [{"reward": 0.0, "vary": True}] * 40
    run = FakeRun(tmp_path / "b", rows=mixed, max_steps=3, max_degenerate_steps=5,
                  worker={"reward": lambda row, i: float(i % 2) if row.get("vary") else row["reward"]})
    assert asyncio.run(run.run()).version == 3


def test_ppo_warm_up_holds_the_policy_and_learner_failover_rewinds_the_critic(tmp_path):
    run = FakeRun(tmp_path, rows=ROWS, max_steps=6, checkpoint_every=2, max_restarts=1, critic={"value": 0.25}, critic_warmup=2,
                  hooks=[KillLearner(after_step=3)])
    loop = asyncio.run(run.run())
    assert loop.version == 6
    # warm-up: the first two versions leave the policy as it is, the later ones train it
    assert [ids for _, ids in run.trained[:2]] == [["held"], ["held"]]
    assert all(ids != ["held"] for _, ids in run.trained[2:])
    # the critic trained at every step beside the learner, step 4 too while the dead learner's failed; the
    # failover put it back to checkpoint 2 with the learner, and steps 3 and 4 were trained again
    assert [s for s, _, _ in run.critic_seen] == [1, 2, 3, 4, 3, 4, 5, 6]
    for _, ids, returns in run.critic_seen:  # gamma = lambda = 1: every action token's return is its episode's reward
        assert returns and set(returns) <= {0.0, 1.0}
    assert_each_prompt_once(run)
    steps = [r for r in map(json.loads, run.run_dir.metrics.read_text().splitlines()) if r["kind"] == "step"]
    assert all(s["value_tokens"] > 0 and s["advantage_abs_mean"] > 0 for s in steps)  # R - V with V = 0.25: never 0
    assert {s.get("policy_held") for s in steps[:2]} == {1.0}
    assert json.loads((latest_checkpoint(tmp_path) / "critic" / "trainer_state.json").read_text())["step"] == 4


def test_colocated_generators_sleep_before_every_step_and_never_generate_asleep(tmp_path):
    run = FakeRun(tmp_path, rows=ROWS, max_steps=4, max_staleness=0, colocated=True, sleep_level=2)
    loop = asyncio.run(run.run())
    assert loop.version == 4
    calls = run.fleet.generators[0].obj.calls
    assert [c for c in calls if c[0] == "sleep"] == [("sleep", 2)] * 4
    for i, (kind, _) in enumerate(calls):  # asleep from a sleep to the next load: no request in between
        if kind == "sleep":
            after = [k for k, _ in calls[i + 1:]]
            assert after and after[0] == "load", calls
    # every request of a step's batch was written by the version the learner held: on-policy
    assert all(int(k) == 0 for s in map(json.loads, run.run_dir.metrics.read_text().splitlines())
               if s["kind"] == "step" for k in s["staleness_hist"])


def test_an_offloading_learner_hands_its_memory_back_after_every_published_step(tmp_path):
    run = FakeRun(tmp_path, rows=ROWS, max_steps=3, max_staleness=0, colocated=True, sleep_level=2, offload_learner=True)
    asyncio.run(run.run())
    # after each step is trained and published, before the next: step k trained, then offloaded
    kinds = [(step, ids == ["offloaded"]) for step, ids in run.trained]
    assert kinds == [(1, False), (1, True), (2, False), (2, True), (3, False), (3, True)], run.trained
    steps = [r for r in map(json.loads, run.run_dir.metrics.read_text().splitlines()) if r["kind"] == "step"]
    assert len(steps) == 3 and all("learner_offload_s" in s for s in steps)
    plain = FakeRun(tmp_path / "plain", rows=ROWS, max_steps=2, max_staleness=0, colocated=True, sleep_level=2)
    asyncio.run(plain.run())
    assert not [t for t in plain.trained if t[1] == ["offloaded"]]


def test_separate_generators_never_sleep(tmp_path):
    run = FakeRun(tmp_path, rows=ROWS, max_steps=3, max_staleness=1)
    asyncio.run(run.run())
    assert not [c for c in run.fleet.generators[0].obj.calls if c[0] == "sleep"]


def test_colocated_steps_wait_for_every_group_in_flight(tmp_path):
    # prompt 1's group runs on long after its tokens: separate, a step starts without it;
    # colocated, no step starts while it is in flight (the learner would share its devices)
    class Probe:
        overlaps = 0

        async def on_round(self, loop):
            if loop._train_task is not None and not loop._train_task.done() and loop.pending:
                Probe.overlaps += 1

        async def after_step(self, loop):
            return None

    slow = {"delay_s": lambda idx: 0.3 if idx % 3 == 1 else 0.0}
    Probe.overlaps = 0
    step = {"step_delay_s": 0.2}
    asyncio.run(FakeRun(tmp_path / "sep", rows=ROWS, max_steps=3, max_staleness=1, worker=slow, learner=step, hooks=[Probe()]).run())
    assert Probe.overlaps > 0
    Probe.overlaps = 0
    asyncio.run(FakeRun(tmp_path / "colo", rows=ROWS, max_steps=3, max_staleness=1, worker=slow, learner=step, hooks=[Probe()],
                        colocated=True).run())
    assert Probe.overlaps == 0


def test_a_step_reports_the_learner_calls_time_beyond_the_ranks_own_as_transfer(tmp_path):
    """``step_transfer_s``: the loop's time for the learner call less the rank's own ``train_s``
    (the batch's way to the ranks and back), not the call's whole time."""
    run = FakeRun(tmp_path, rows=ROWS, max_steps=2, max_staleness=1, learner={"step_delay_s": 0.3})
    asyncio.run(run.run())
    steps = [r for r in map(json.loads, run.run_dir.metrics.read_text().splitlines()) if r["kind"] == "step"]
    assert len(steps) == 2
    for s in steps:
        assert s["train_s"] >= 0.3 and 0.0 <= s["step_transfer_s"] < 0.3, s
