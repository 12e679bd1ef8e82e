"""A sandbox worker that died and was replaced inside its rollout worker is said in the run's
record: one ``sandbox_worker_restarts`` event per step that saw new replacements, counted from
zero again for a rollout worker that was itself replaced, and nothing for a worker that cannot
answer (over the shipped fakes; the real sandbox's counter is tested in tests/sandbox)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from agentrl.engine.loop.sandbox_watch import SandboxWatch
from agentrl.engine.common.cluster import kill
from agentrl.engine.testing import FakeRun, FakeWorker, local_actor

ROWS = [{"reward": float(i % 2)} for i in range(200)]


class _Log:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def event(self, message: str, **fields: Any) -> None:
        self.events.append((message, fields))


class SandboxDeaths:
    """Loop hook: after step ``at`` rollout worker 0's sandbox has replaced ``n`` more workers."""

    def __init__(self, at: int, n: int) -> None:
        self.at, self.n = at, n

    async def on_round(self, loop: Any) -> None:
        return None

    async def after_step(self, loop: Any) -> None:
        if loop.version == self.at:
            loop.fleet.workers[0].obj.sandbox_replaced += self.n


def test_each_steps_new_sandbox_replacements_are_one_event_in_the_metrics(tmp_path):
    watch = SandboxWatch(log=None)  # type: ignore[arg-type]  # given the run's log below
    run = FakeRun(tmp_path, rows=ROWS, max_steps=5, hooks=[SandboxDeaths(2, 1), SandboxDeaths(4, 2), watch])
    watch.log = run.log
    asyncio.run(run.run())
    records = [json.loads(x) for x in run.run_dir.metrics.read_text().splitlines()]
    said = [(r["step"], r["sandbox_worker_restarts"], r["message"]) for r in records if r.get("sandbox_worker_restarts")]
    assert [(s, n) for s, n, _ in said] == [(2, 1), (4, 2)], said
    assert said[1][2] == "rollout worker 0: 2 sandbox workers died or misbehaved and were replaced (3 in this run)"
    assert "1 sandbox worker died or misbehaved and was replaced (1 in this run)" in run.console.getvalue()


def test_a_replaced_rollout_worker_counts_its_own_sandbox_from_zero():
    log = _Log()
    watch = SandboxWatch(log=log)  # type: ignore[arg-type]
    old = FakeWorker([])
    old.sandbox_replaced = 3
    assert asyncio.run(watch.check([local_actor(old, "rollout worker 0")], step=1)) == 3
    new = FakeWorker([])  # a new process: its counters start at 0
    new.sandbox_replaced = 1
    assert asyncio.run(watch.check([local_actor(new, "rollout worker 0")], step=2)) == 1
    assert asyncio.run(watch.check([local_actor(new, "rollout worker 0")], step=3)) == 0
    assert [f["sandbox_worker_restarts"] for _, f in log.events] == [3, 1]
    assert watch.total == 4


def test_a_dead_rollout_worker_is_skipped_and_the_others_still_counted():
    log = _Log()
    watch = SandboxWatch(log=log, timeout_s=2.0)  # type: ignore[arg-type]
    dead, live = FakeWorker([]), FakeWorker([])
    dead.sandbox_replaced = live.sandbox_replaced = 1
    dead_handle = local_actor(dead, "rollout worker 0")
    kill(dead_handle)  # as if its process was SIGKILLed: every call raises
    assert asyncio.run(watch.check([dead_handle, local_actor(live, "rollout worker 1")], step=1)) == 1
    assert [m for m, _ in log.events] == ["rollout worker 1: 1 sandbox worker died or misbehaved and was replaced (1 in this run)"]
