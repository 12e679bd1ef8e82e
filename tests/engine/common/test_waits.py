"""Bounded waits on real Ray actors: a wait that runs out cancels the remote call."""

import asyncio
import time

import pytest

from agentrl.engine.common.waits import timed
from agentrl.errors import LearnerError, TimeoutError_


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


def test_a_cancelled_wait_on_a_gather_leaves_nothing_for_asyncio_to_print():
    """A run that ends while a wait on several calls is open (``timed(asyncio.gather(...))``)
    cancels that wait. The gather then holds a CancelledError that nobody reads, which asyncio
    printed on the console as a raw "_GatheringFuture exception was never retrieved" traceback."""
    import gc

    reported: list[str] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: reported.append(ctx["message"]))
        wait = asyncio.ensure_future(timed(asyncio.gather(asyncio.sleep(10), asyncio.sleep(10)), 30, "two calls"))
        await asyncio.sleep(0.05)
        wait.cancel()
        with pytest.raises(asyncio.CancelledError):
            await wait
        await asyncio.sleep(0.05)
        gc.collect()
        await asyncio.sleep(0.05)

    asyncio.run(main())
    gc.collect()
    assert reported == []
