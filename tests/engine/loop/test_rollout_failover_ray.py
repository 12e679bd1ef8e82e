"""Rollout worker failover against a real Ray actor killed with SIGKILL: Ray's ActorDiedError is
recognised as a death, the in-flight call's group is counted lost with its worker, the dead actor
is replaced by one started the same way, and a group that fails on a live actor is no death."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import pytest

from agentrl.engine.loop.rollout_failover import RolloutFailover


class _Worker:
    """A rollout worker's shape: ``ping``, ``process_id`` and a long ``run_group``."""

    def ping(self) -> bool:
        return True

    def process_id(self) -> int:
        return os.getpid()

    async def run_group(self, seconds: float) -> list[Any]:
        await asyncio.sleep(seconds)
        return []


class _Log:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def event(self, message: str, **fields: Any) -> None:
        self.events.append((message, fields))


@pytest.mark.ray
def test_a_sigkilled_ray_worker_is_replaced_once_for_all_its_groups(ray_local):
    ray = ray_local  # the session's local Ray (tests/conftest.py)
    actor = ray.remote(_Worker).options(num_cpus=0.1)

    async def go() -> tuple[list[bool], bool, list[Any], _Log, list[int], int]:
        workers = [actor.remote()]
        pids = [await workers[0].process_id.remote()]
        torn_down: list[int] = []
        log = _Log()

        async def start(index: int) -> Any:
            new = actor.remote()
            pids.append(await new.process_id.remote())
            return new

        async def teardown(index: int) -> None:
            torn_down.append(index)

        failover = RolloutFailover(workers=lambda: workers, start=start, teardown=teardown, max_restarts=1, log=log)
        # a group that fails on a live worker (it timed out) is no death
        alive = await failover.group_lost(workers[0], TimeoutError("group p0 did not finish within 1 s"))
        dead = workers[0]
        calls = [dead.run_group.remote(60) for _ in range(3)]  # three groups in flight
        await asyncio.sleep(0.5)
        os.kill(pids[0], signal.SIGKILL)  # from outside, as the OOM killer would
        died = []
        for call in calls:
            try:
                await call
                raise AssertionError("a group of a killed worker finished")
            except ray.exceptions.RayActorError as exc:
                died.append(await failover.group_lost(dead, exc))
        answer = await workers[0].ping.remote()
        return died, alive, workers, log, torn_down, int(answer)

    died, alive, workers, log, torn_down, answer = asyncio.run(go())
    for w in workers:
        ray.kill(w)  # the replacement too: the next test shares this Ray
    assert alive is False
    assert died == [True, True, True] and answer == 1 and torn_down == [0]
    assert len(log.events) == 1, log.events
    message, fields = log.events[0]
    assert message.startswith("rollout worker 0 died (") and fields == {"rollout_worker_restarts": 1}, log.events
