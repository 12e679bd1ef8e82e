"""Bounded waits on real Ray actors: a wait that runs out cancels the remote call."""

import asyncio
import time

import pytest

from agentrl.engine.common.waits import timed
from agentrl.errors import LearnerError, TimeoutError_


@pytest.fixture(scope="module")
def ray_local():
    import ray

    ray.init(num_cpus=1, include_dashboard=False, logging_level="error")
    yield ray
    ray.shutdown()


class Slow:
    def __init__(self) -> None:
        self.finished = 0
        self.cancelled = 0

    async def work(self, seconds: float) -> str:
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        self.finished += 1
        return "done"

    def counts(self) -> tuple[int, int]:
        return self.finished, self.cancelled


def test_a_timed_out_remote_call_is_cancelled(ray_local):
    actor = ray_local.remote(Slow).options(num_cpus=0, max_concurrency=4).remote()

    async def main() -> None:
        assert await timed(actor.work.remote(0.01), 30, "a quick call") == "done"
        t0 = time.monotonic()
        with pytest.raises(TimeoutError_, match="episode group p7 did not finish within 1 s"):
            await timed(actor.work.remote(20), 1, "episode group p7")
        assert time.monotonic() - t0 < 10
        with pytest.raises(LearnerError, match="learner step 3"):
            await timed(actor.work.remote(20), 1, "learner step 3", LearnerError)
        # a wait cancelled by its caller (the run ended) cancels the remote call as well
        task = asyncio.ensure_future(timed(actor.work.remote(20), 60, "a group in flight at the end"))
        await asyncio.sleep(1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    deadline = time.monotonic() + 15
    while ray_local.get(actor.counts.remote()) != (1, 3) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray_local.get(actor.counts.remote()) == (1, 3)  # the three slow calls were stopped, not left running
