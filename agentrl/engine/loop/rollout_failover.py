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

from collections.abc import Awaitable, Callable
from typing import Any

from agentrl.engine.common.replacement import ActorSlots, EventLog, Replacements
from agentrl.errors import InfraError

__all__ = ["RolloutFailover"]


class RolloutFailover(ActorSlots):
    """Replaces dead rollout workers of ``workers`` (the live list the loop routes groups to,
    ``GeneratorFleet.workers``), at most ``max_restarts`` times (the shared machinery:
    :class:`~agentrl.engine.common.replacement.ActorSlots`).

    ``start(index)``: a new worker to take slot ``index``, started and answering (its start-up
    bounded by ``startup_timeout_s``); ``teardown(index)``: release what the dead worker of slot
    ``index`` held outside its process (None: nothing); ``ping_timeout_s``: how long a worker
    whose group failed has to answer before it counts as dead."""

    def __init__(
        self, *, workers: Callable[[], list[Any]], start: Callable[[int], Awaitable[Any]], max_restarts: int, log: EventLog,
        teardown: Callable[[int], Awaitable[None]] | None = None, ping_timeout_s: float = 30.0,
        startup_timeout_s: float = 300.0,
    ) -> None:
        super().__init__(
            name="rollout worker", slots=workers, start=start, teardown=teardown, probe="ping", probe_timeout_s=ping_timeout_s,
            consequence="its groups in flight are re-issued",
            replacements=Replacements(metric="rollout_worker_restarts", log=log, max_restarts=max_restarts,
                                      setting="rollout.max_restarts", error=InfraError, startup_timeout_s=startup_timeout_s),
        )
        self.workers = workers
        self.max_restarts = max_restarts

    async def group_lost(self, worker: Any, exc: BaseException) -> bool:
        """A group's call into ``worker`` raised ``exc``: whether ``worker`` is dead (then it is
        replaced now, or was already by an earlier call for another of its groups).

        Raises:
            InfraError: it died and ``max_restarts`` replacements were already made, or its
                replacement could not be started.
        """
        return await self.lost(worker, exc)
