"""Sandbox worker replacements, said in the run's record.

A warm bubblewrap sandbox replaces, inside its rollout worker's process, a worker that died or
misbehaved (an execution killed it, or it stopped answering); the next execution gets a fresh
one and never sees the death (:class:`agentrl.sandbox.bubblewrap.PoolStats`). Nothing else
reaches the run, so a component killed from outside left no trace in ``metrics.jsonl``.

:class:`SandboxWatch` is a loop hook (:class:`~agentrl.engine.loop.loop.LoopHook`): after every
learner step it asks each rollout worker for its sandbox's counters
(:meth:`~agentrl.engine.episodes.rollout.RolloutWorker.sandbox_stats`) and logs the replacements
made since it last asked as one event (``sandbox_worker_restarts``: how many), said on the
console in one line. A rollout worker that was itself replaced (a new process id) starts its
count from zero; one that is dead or does not answer within ``timeout_s`` is skipped (its own
failover speaks for it).
"""

from __future__ import annotations

import asyncio
from typing import Any

from agentrl.engine.common.replacement import EventLog
from agentrl.engine.common.waits import timed

__all__ = ["SandboxWatch"]


class SandboxWatch:
    """Logs each rollout worker's new sandbox worker replacements after every step.

    ``log``: where the events go (a ``MetricsLogger``); ``timeout_s``: how long a worker has to
    give its counters before it is skipped for this step."""

    def __init__(self, *, log: EventLog, timeout_s: float = 10.0) -> None:
        self.log = log
        self.timeout_s = timeout_s
        self.seen: dict[int, tuple[int, int]] = {}
        """What each worker slot last said: (its process id, replacements so far)."""
        self.total = 0
        """Sandbox worker replacements logged in this run (by this watch)."""

    async def on_round(self, loop: Any) -> None:
        """Nothing: counted once per step."""

    async def after_step(self, loop: Any) -> None:
        """Log the replacements of the rollout workers of ``loop.fleet.workers`` since the last step."""
        await self.check(list(loop.fleet.workers), step=loop.version)

    async def check(self, workers: list[Any], *, step: int) -> int:
        """Ask each worker of ``workers`` for its sandbox counters and log the new replacements
        (one event per worker that made any); returns how many were new."""
        answers = await asyncio.gather(  # all at once: one timeout for the step, not one per worker
            *[timed(w.sandbox_stats.remote(), self.timeout_s, f"rollout worker {i}'s sandbox counters") for i, w in enumerate(workers)],
            return_exceptions=True,
        )
        new_total = 0
        for slot, stats in enumerate(answers):
            if isinstance(stats, BaseException):  # dead, replaced or busy: the worker's failover says what happened to it
                continue
            pid, replaced = int(stats.get("pid", 0)), int(stats.get("workers_replaced", 0))
            seen_pid, seen = self.seen.get(slot, (pid, 0))
            before = seen if seen_pid == pid else 0
            self.seen[slot] = (pid, replaced)
            new = replaced - before
            if new <= 0:
                continue
            new_total += new
            self.total += new
            self.log.event(
                f"rollout worker {slot}: {new} sandbox worker{'s' if new > 1 else ''} died or misbehaved and "
                f"{'were' if new > 1 else 'was'} replaced ({self.total} in this run)",
                sandbox_worker_restarts=new, step=step,
            )
        return new_total
