"""The learner ranks as one group: placed together, set up together, called together, restarted
together.

A call that finds a rank's process gone raises :class:`~agentrl.errors.LearnerDied` naming the
rank and how it died; the run decides whether to restart the group (learner failover) or stop.

A call's arguments (a training batch: every rank receives the same list) are serialised once:
with Ray ranks each argument that is not a plain scalar goes into Ray's object store once, in a
helper thread, and every rank is handed the reference (Ray resolves a top-level reference to its
value before the method runs, so the ranks see exactly what they saw before). Passing the batch
itself would pickle it once per rank, on the driver's event loop.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import Any

from agentrl.engine.common.cluster import actor_died, kill, shutdown_all
from agentrl.engine.common.waits import timed
from agentrl.errors import LearnerDied, LearnerError

__all__ = ["LearnerGroup", "RankFactory", "shared_arguments"]

_PEER_GRACE_S = 5.0
"""After one rank's call fails, how long the others' outcomes are awaited before reporting."""

RankFactory = Callable[[int, dict[str, Any], dict[str, Any]], Any]
"""``factory(rank, kwargs, options) -> handle``: starts (does not set up) rank ``rank`` with the
learner's keyword arguments ``kwargs`` (completed by the group: rank, master address and port)
and the Ray actor ``options`` that place it ({} without a placement)."""


_SCALARS = (str, bytes, int, float, bool, type(None))
"""Arguments passed as they are: small, and Ray inlines them in the call."""


async def shared_arguments(handles: list[Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``args``/``kwargs`` for calling the same method on every handle of ``handles``: with Ray
    actor handles, each value that is not a scalar replaced by a reference to one copy of it in
    Ray's object store (serialised once, in a helper thread, not on the event loop); with
    in-process doubles (or no Ray) unchanged."""
    ray = sys.modules.get("ray")
    if ray is None or not handles or not all(isinstance(h, ray.actor.ActorHandle) for h in handles):
        return args, kwargs
    big = [i for i, a in enumerate(args) if not isinstance(a, _SCALARS)]
    big_kw = [k for k, v in kwargs.items() if not isinstance(v, _SCALARS)]
    if not big and not big_kw:
        return args, kwargs

    def put() -> tuple[tuple[Any, ...], dict[str, Any]]:
        new_args = list(args)
        for i in big:
            new_args[i] = ray.put(args[i])
        return tuple(new_args), {**kwargs, **{k: ray.put(kwargs[k]) for k in big_kw}}

    return await asyncio.to_thread(put)


class LearnerGroup:
    """``num_ranks`` learner ranks forming one torch.distributed group.

    ``placement``: builds the reservation of the ranks (``() -> LearnerPlacement``-like object
    with ``rendezvous(timeout)``, ``options(rank)``, ``release()``), or None for in-process
    doubles (rendezvous on 127.0.0.1); ``factory``: creates one rank; ``timeout_s``: the longest
    wait for one call (a training step, a publication, a checkpoint); ``name``: what the ranks
    are, in words (``"learner"``, ``"critic"``: a death says "critic rank 0 died ...").
    """

    def __init__(
        self, *, num_ranks: int, factory: RankFactory,
        placement: Callable[[], Any] | None, timeout_s: float, placement_timeout_s: float = 300.0, name: str = "learner",
    ) -> None:
        self.name = name
        self.num_ranks = num_ranks
        self.factory = factory
        self.placement_factory = placement
        self.timeout_s = timeout_s
        self.placement_timeout_s = placement_timeout_s
        self.handles: list[Any] = []
        self.placement: Any = None

    def __bool__(self) -> bool:
        return bool(self.handles)

    async def reserve(self) -> None:
        """Reserve the ranks' resources now, before anything else asks the cluster for them (the
        generators), unless they are reserved already; :meth:`start` uses the reservation, and
        :meth:`stop`/:meth:`kill` free it."""
        if self.placement is None and self.placement_factory is not None:
            self.placement = await asyncio.to_thread(self.placement_factory)

    async def start(self, kwargs: dict[str, Any], what: str = "learner set-up") -> list[Any]:
        """Create every rank with the learner arguments ``kwargs`` and set them up; the set-up
        results (rank 0 first). Stops a group already running first (and frees its reservation);
        a reservation made by :meth:`reserve` for a group not yet running is used."""
        if self.handles:
            await self.stop()
        await self.reserve()
        if self.placement is not None:
            address, port = await asyncio.to_thread(self.placement.rendezvous, self.placement_timeout_s)
        else:
            address, port = "127.0.0.1", 0
        self.handles = [
            self.factory(rank, {**kwargs, "rank": rank, "master_addr": address, "master_port": port},
                         self.placement.options(rank) if self.placement is not None else {})
            for rank in range(self.num_ranks)
        ]
        return await self.call("setup", what=what)

    async def call(self, method: str, *args: Any, what: str, timeout: float | None = None, **kwargs: Any) -> list[Any]:
        """``method(*args, **kwargs)`` on every rank at once; the results by rank. A dead rank
        raises LearnerDied; a wait past ``timeout`` (default: the group's) LearnerError."""
        if not self.handles:
            raise LearnerError(f"{what}: the {self.name} is not running")
        handles = self.handles
        args, kwargs = await shared_arguments(handles, args, kwargs)  # one copy for every rank
        refs = [getattr(h, method).remote(*args, **kwargs) for h in handles]
        futures = [asyncio.ensure_future(timed(ref, timeout or self.timeout_s, f"{what} (rank {i})", LearnerError)) for i, ref in enumerate(refs)]
        try:
            _, pending = await asyncio.wait(futures, return_when=asyncio.FIRST_EXCEPTION)
            if pending:  # a rank failed: its peers fail soon after (their collective broke);
                # wait a moment so that a rank that *died* is named rather than a peer's error
                await asyncio.wait(pending, timeout=_PEER_GRACE_S)
            failures = [(rank, f.exception()) for rank, f in enumerate(futures) if f.done() and not f.cancelled() and f.exception() is not None]
            for rank, exc in failures:
                how = actor_died(exc)
                if how is not None:
                    raise LearnerDied(f"{self.name} rank {rank} died during {what}: {how}", rank=rank, how=how, group=self.name) from exc
            if failures:
                raise failures[0][1]
            return [f.result() for f in futures]
        finally:
            for f in futures:
                if not f.done():
                    f.cancel()

    async def stop(self) -> None:
        """Shut every rank down (bounded) and free their placement."""
        handles, self.handles = self.handles, []
        await shutdown_all(handles, 60)
        self.release()

    def kill(self) -> None:
        """Kill every rank now (their state is lost) and free their placement."""
        for h in self.handles:
            kill(h)
        self.handles = []
        self.release()

    def release(self) -> None:
        """Free the ranks' reserved resources (after their actors are gone)."""
        if self.placement is not None:
            self.placement.release()
            self.placement = None
