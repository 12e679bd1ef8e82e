"""The learner group's reservation (:class:`agentrl.engine.training.learner_group.LearnerGroup`):
:meth:`reserve` asks the cluster for the ranks' resources before anything else does (the controller
calls it before it creates the generators), :meth:`start` uses that reservation rather than making
a second one, and a restart frees the old reservation before it makes the new one."""

from __future__ import annotations

import asyncio
from typing import Any

from agentrl.engine.testing import FakeLearner, local_actor
from agentrl.engine.training.learner_group import LearnerGroup


class Reservation:
    """A placement double: records the order of events in ``log``."""

    def __init__(self, log: list[str], n: int) -> None:
        self.log, self.n = log, n
        log.append(f"reserve {n}")

    def rendezvous(self, timeout_s: float) -> tuple[str, int]:
        return "10.0.0.2", 29500

    def options(self, rank: int) -> dict[str, Any]:
        self.log.append(f"rank {rank} in reservation {self.n}")
        return {"reservation": self.n}

    def release(self) -> None:
        self.log.append(f"release {self.n}")


def group(log: list[str]) -> LearnerGroup:
    made = iter(range(1, 100))
    return LearnerGroup(
        num_ranks=2, timeout_s=10, placement=lambda: Reservation(log, next(made)),
        factory=lambda rank, kwargs, options: local_actor(FakeLearner(rank=rank), f"learner {rank}"),
    )


def test_reserve_comes_first_and_start_uses_that_reservation() -> None:
    log: list[str] = []
    g = group(log)

    async def go() -> None:
        await g.reserve()
        log.append("generators created")  # what the controller does between the two
        await g.reserve()  # idempotent
        await g.start({})

    asyncio.run(go())
    assert log == ["reserve 1", "generators created", "rank 0 in reservation 1", "rank 1 in reservation 1"]


def test_a_restart_frees_the_old_reservation_before_making_a_new_one() -> None:
    log: list[str] = []
    g = group(log)

    async def go() -> None:
        await g.start({})
        await g.start({})  # a running group restarts
        g.kill()

    asyncio.run(go())
    assert log == [
        "reserve 1", "rank 0 in reservation 1", "rank 1 in reservation 1",
        "release 1", "reserve 2", "rank 0 in reservation 2", "rank 1 in reservation 2", "release 2",
    ]
