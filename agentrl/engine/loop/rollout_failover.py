"""Rollout worker failover: a rollout worker whose process died (killed, out of memory, crashed)
is replaced by a new one with the same settings, and the run goes on, as the fleet does for a
generator (:meth:`agentrl.engine.generation.fleet.GeneratorFleet.heal`).

The loop calls :meth:`RolloutFailover.group_lost` for every group whose call into its worker
failed (it raised instead of returning episodes). A worker counts as dead when Ray says its
process is gone, or when it does not answer a ping within ``ping_timeout_s`` (a group that merely
timed out on a live worker is not a death). A replacement, in order:

1. stop the dead actor for good (``ray.kill``: a hung process is ended, nothing restarts it);
2. ``teardown(index)``: release what the dead process held outside itself (its Docker sandbox
   containers; bubblewrap sandboxes die with their parent, ``--die-with-parent``, and the agent
   gateway was a server inside the process);
3. ``start(index)``: a new worker with the same environment, sandbox and reward settings, on the
   fleet's current generators, started and answering;
4. put it in the dead one's place (``workers[index]``): the next groups go to it;
5. one event in ``metrics.jsonl`` (``rollout_worker_restarts``), said on the console in one line.

The groups the dead worker had in flight fail one by one at the loop: the ledger re-issues each
prompt as a retry (a new group id), and those losses do not count towards
``max_lost_in_a_row`` (one process died; the rollout is not broken). At most ``max_restarts``
replacements per run; the next death stops the run with :class:`~agentrl.errors.InfraError`
naming the setting.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from agentrl.engine.common.cluster import actor_died, kill
from agentrl.engine.generation.fleet import EventLog
from agentrl.engine.common.waits import timed
from agentrl.errors import InfraError

__all__ = ["RolloutFailover"]


class RolloutFailover:
    """Replaces dead rollout workers of ``workers`` (the live list the loop routes groups to,
    ``GeneratorFleet.workers``), at most ``max_restarts`` times.

    ``start(index)``: a new worker to take slot ``index``, started and answering (its start-up
    bounded by ``startup_timeout_s``); ``teardown(index)``: release what the dead worker of slot
    ``index`` held outside its process (None: nothing); ``ping_timeout_s``: how long a worker
    whose group failed has to answer before it counts as dead."""

    def __init__(
        self, *, workers: Callable[[], list[Any]], start: Callable[[int], Awaitable[Any]], max_restarts: int, log: EventLog,
        teardown: Callable[[int], Awaitable[None]] | None = None, ping_timeout_s: float = 30.0,
        startup_timeout_s: float = 300.0,
    ) -> None:
        self.workers = workers
        self.start = start
        self.teardown = teardown
        self.max_restarts = max_restarts
        self.log = log
        self.ping_timeout_s = ping_timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.restarts = 0
        """Replacements done so far."""
        self._lock = asyncio.Lock()

    async def group_lost(self, worker: Any, exc: BaseException) -> bool:
        """A group's call into ``worker`` raised ``exc``: whether ``worker`` is dead (then it is
        replaced now, or was already by an earlier call for another of its groups).

        Raises:
            InfraError: it died and ``max_restarts`` replacements were already made, or its
                replacement could not be started.
        """
        async with self._lock:  # one replacement at a time; its other groups find it done
            slots = self.workers()
            index = next((i for i, w in enumerate(slots) if w is worker), None)
            if index is None:
                return True  # replaced already (or not one of ours any more)
            how = actor_died(exc)
            if how is None:
                try:
                    await asyncio.wait_for(worker.ping.remote(), self.ping_timeout_s)
                    return False  # alive: the group failed for its own reasons
                except Exception as ping_exc:  # noqa: BLE001 - dead actor, no answer
                    how = actor_died(ping_exc) or f"it does not answer ({type(ping_exc).__name__})"
            if self.restarts >= self.max_restarts:
                raise InfraError(
                    f"rollout worker {index} died ({how}) after {self.restarts} replacements in this run "
                    f"(rollout.max_restarts = {self.max_restarts}; rerunning the command resumes from the newest checkpoint)"
                )
            kill(worker)
            if self.teardown is not None:
                await self.teardown(index)
            try:
                new = await timed(self.start(index), self.startup_timeout_s, f"replacing rollout worker {index}", InfraError)
            except InfraError:
                raise
            except Exception as start_exc:  # noqa: BLE001 - the new actor failed in its constructor
                raise InfraError(
                    f"rollout worker {index} died ({how}) and its replacement failed to start: "
                    f"{type(start_exc).__name__}: {str(start_exc)[:300]}"
                ) from start_exc
            slots[index] = new
            self.restarts += 1
            self.log.event(
                f"rollout worker {index} died ({how}); replaced by a new one, its groups in flight are re-issued",
                rollout_worker_restarts=1,
            )
            return True
