"""Rollout worker failover over the shipped fakes (agentrl.engine.testing): a rollout worker that
dies mid-run is replaced with the same settings, its groups in flight are re-issued as new groups,
and the run goes on; replacements are bounded; a group that fails on a live worker is no death."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import pytest

from agentrl.engine.loop.rollout_failover import RolloutFailover
from agentrl.engine.testing import FakeRun, FakeWorker, KillWorker, local_actor
from agentrl.errors import InfraError

ROWS = [{"reward": float(i % 2)} for i in range(200)]
#: 8 groups a batch and a staleness bound of 1: up to 16 groups in flight on the one worker when
#: it dies, more than the ledger's ``max_lost_in_a_row`` (8) lets be lost one after the other.
BIG = {"batch_size": 16, "group_size": 2, "max_staleness": 1, "worker": {"delay_s": lambda idx: 0.02}}


def events(run: FakeRun) -> list[dict]:
    return [r for r in map(json.loads, run.run_dir.metrics.read_text().splitlines()) if r["kind"] == "event"]


def test_a_dead_rollout_worker_is_replaced_and_its_groups_reissued(tmp_path):
    kill = KillWorker(after_step=2)
    run = FakeRun(tmp_path, rows=ROWS, max_steps=5, worker_restarts=2, hooks=[kill], **BIG)
    loop = asyncio.run(run.run())
    assert loop.version == 5 and run.workers_made == 2
    restarts = [e for e in events(run) if e.get("rollout_worker_restarts")]
    assert len(restarts) == 1 and restarts[0]["message"].startswith("rollout worker 0 died (killed by the test"), restarts
    dead, new = kill.killed[0].obj, run.fleet.workers[0].obj
    assert new is not dead
    # every group the dead worker had in flight was lost with it and issued again, as a new group
    lost_lines = [m for m in (e["message"] for e in events(run)) if m.startswith("group ") and m.endswith("re-issued")]
    assert all(m.endswith("failed on infrastructure (its rollout worker died); re-issued") for m in lost_lines), lost_lines
    lost = {m.split()[1] for m in lost_lines}
    assert len(lost) > 8  # more than max_lost_in_a_row: these losses do not count as a broken rollout
    retried = {g.split("-")[0] for g in new.groups if "-" in g}
    assert {g.split("-")[0] for g in lost} <= retried | {f"p{i}" for i in loop.ledger.untrained(loop.queue)}
    # each prompt trained once, and nothing of the lost groups
    prompts = [p for line in map(json.loads, run.run_dir.trained.read_text().splitlines()) for p in line["prompts"]]
    assert len(prompts) == len(set(prompts)), Counter(prompts).most_common(3)
    ids = [i for _, step_ids in run.trained for i in step_ids]
    assert len(ids) == len(set(ids))
    assert not {i.split("/")[0] for i in ids} & lost
    assert loop.ledger.abandoned == []


def test_without_failover_a_dead_worker_stops_the_run(tmp_path):
    """The control: the same kill with no replacement loses every later group."""
    run = FakeRun(tmp_path, rows=ROWS, max_steps=5, hooks=[KillWorker(after_step=2)], **BIG)
    with pytest.raises(InfraError, match="rollout keeps failing"):
        asyncio.run(run.run())


def test_rollout_worker_replacements_are_bounded(tmp_path):
    run = FakeRun(tmp_path, rows=ROWS, max_steps=8, worker_restarts=1, hooks=[KillWorker(after_step=1, times=2)], **BIG)
    with pytest.raises(InfraError, match=r"rollout worker 0 died .* after 1 replacements in this run \(rollout.max_restarts = 1"):
        asyncio.run(run.run())
    assert run.workers_made == 2


class _Log:
    def __init__(self) -> None:
        self.events: list[str] = []

    def event(self, message: str, **fields: Any) -> None:
        self.events.append(message)


def test_a_group_failing_on_a_live_worker_is_no_death():
    async def go() -> tuple[bool, list[Any], _Log]:
        worker = local_actor(FakeWorker([]), "worker 0")
        workers = [worker]
        log = _Log()

        async def start(index: int) -> Any:
            raise AssertionError("nothing to replace")

        failover = RolloutFailover(workers=lambda: workers, start=start, max_restarts=2, log=log, ping_timeout_s=5.0)
        died = await failover.group_lost(worker, TimeoutError("group p3 did not finish within 60 s"))
        return died, workers, log

    died, workers, log = asyncio.run(go())
    assert died is False and log.events == [] and len(workers) == 1


def test_a_worker_that_does_not_answer_is_replaced_once_for_all_its_groups():
    async def go() -> tuple[list[bool], list[Any], list[Any], _Log]:
        worker = local_actor(FakeWorker([]), "worker 0")
        worker.kill()
        workers, made = [worker], []
        log = _Log()

        async def start(index: int) -> Any:
            made.append(local_actor(FakeWorker([]), f"worker {index}"))
            return made[-1]

        failover = RolloutFailover(workers=lambda: workers, start=start, max_restarts=2, log=log, ping_timeout_s=5.0)
        died = [await failover.group_lost(worker, TimeoutError("no answer")) for _ in range(3)]
        return died, workers, made, log

    died, workers, made, log = asyncio.run(go())
    assert died == [True, True, True] and len(made) == 1 and workers == made
    assert len(log.events) == 1 and log.events[0].startswith("rollout worker 0 died (killed by the test")
