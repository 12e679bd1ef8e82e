"""The learner group hands a call's arguments (a training batch) to every rank from one copy in
Ray's object store: serialised once, whatever the number of ranks, and each rank receives the
same value it received before. Proven on a real local Ray with three rank actors."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

from agentrl.engine.training.learner_group import LearnerGroup, shared_arguments

PICKLED: list[int] = []
"""One entry per time a :class:`Batch` was serialised in this (the driver's) process."""


class Batch(list):
    """A training batch that counts how often the driver serialises it; it arrives as a list."""

    def __reduce__(self) -> Any:
        PICKLED.append(1)
        return (list, (list(self),))


class Rank:
    """A learner rank that reports what it received."""

    def setup(self) -> None:
        return None

    def shutdown(self) -> None:
        return None

    def train_step(self, samples: Any, *, extra: Any = None) -> dict[str, Any]:
        return {"type": type(samples).__name__, "samples": samples, "extra": extra, "pid": os.getpid()}

    def ping_all(self, generators: list[Any]) -> list[str]:
        """As ``connect_weight_transfer`` does: call actors whose handles came in a list."""
        import ray

        return ray.get([g.ping.remote() for g in generators], timeout=60)


class Generator:
    def ping(self) -> str:
        return "pong"


@pytest.mark.ray
def test_a_batch_is_serialised_once_for_every_rank_and_arrives_unchanged(ray_local):
    ray = ray_local
    group = LearnerGroup(
        num_ranks=3, placement=None, timeout_s=120.0,
        factory=lambda rank, kwargs, options: ray.remote(Rank).options(num_cpus=0).remote(),
    )

    async def go() -> tuple[list[Any], int, list[Any]]:
        await group.start({})
        try:
            PICKLED.clear()
            samples = Batch([{"id": "a", "tokens": [1, 2, 3]}, {"id": "b", "tokens": [4]}])
            results = await group.call("train_step", samples, extra=Batch([7]), what="a step")
            pickled = len(PICKLED)
            gen = ray.remote(Generator).options(num_cpus=0).remote()  # actor handles travel through the store too
            return results, pickled, await group.call("ping_all", [gen], what="reaching the generators")
        finally:
            await group.stop()

    results, pickled, pings = asyncio.run(go())
    # one serialisation of the batch and one of the keyword argument, not one per rank (3 + 3)
    assert pickled == 2, f"the batch was pickled {pickled} times for 3 ranks"
    assert pings == [["pong"]] * 3
    assert len({r["pid"] for r in results}) == 3  # three processes
    for r in results:  # Ray resolved the reference: each rank got the value itself
        assert r["type"] == "list" and r["samples"] == [{"id": "a", "tokens": [1, 2, 3]}, {"id": "b", "tokens": [4]}]
        assert r["extra"] == [7]


def test_in_process_doubles_and_scalars_are_passed_as_they_are():
    """Without Ray handles (the loop's fakes) nothing is stored: the call is unchanged."""

    class Handle:
        pass

    batch = [{"id": "a"}]
    args, kwargs = asyncio.run(shared_arguments([Handle()], (batch, "x", 3), {"k": batch}))
    assert args[0] is batch and args[1:] == ("x", 3) and kwargs["k"] is batch
