"""Replacing dead actors: the one way the engine tells that an actor died, replaces it (bounded),
and says so.

Every kind of actor that a run replaces in-run goes through here: the policy's generators
(:meth:`agentrl.engine.generation.fleet.GeneratorFleet.heal`), the rollout workers
(:mod:`agentrl.engine.loop.rollout_failover`), a separate judge's generators and the reward
model's actor (the controller's :class:`ActorSlots` of :mod:`agentrl.engine.rewards.reward_actors`'
handles). Learner and critic ranks are restarted together from a checkpoint instead
(:mod:`agentrl.engine.loop.failover`).

- :func:`how_dead`: an actor is dead when Ray says its process is gone, or when it does not
  answer a cheap call (its *probe*) in time; a call that merely failed on a live actor is no death.
- :class:`Replacements`: the replacements of one kind, at most ``max_restarts`` in a run: stop
  the dead actor for good, release what it held outside itself, start the new one (bounded),
  then one event in ``metrics.jsonl`` (``<metric>: 1``), said on the console in one line.
- :class:`ActorSlots`: actors of one kind in numbered slots; a dead one is replaced in its slot and
  the new set is handed to whoever calls them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from agentrl.engine.common.cluster import actor_died, kill
from agentrl.engine.common.waits import timed
from agentrl.errors import AgentRLError, InfraError

__all__ = ["ActorSlots", "EventLog", "Replacements", "how_dead", "tell_workers"]


class EventLog(Protocol):
    """Where a replacement is reported (``MetricsLogger`` is one)."""

    def event(self, message: str, **fields: Any) -> Any: ...


async def tell_workers(workers: list[Any], method: str, *args: Any) -> None:
    """Call ``method(*args)`` on every rollout worker at once. A worker whose process is gone
    (:func:`~agentrl.engine.common.cluster.actor_died`) is skipped: its failover replaces it, and
    the replacement is built with the current value. Any other failure is raised."""
    results = await asyncio.gather(*[getattr(w, method).remote(*args) for w in workers], return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException) and actor_died(result) is None:
            raise result


async def how_dead(handle: Any, probe: str, exc: BaseException | None = None, timeout_s: float = 30.0) -> str | None:
    """How ``handle``'s actor died, in a few words, or None when it is alive.

    ``exc``: what a call into it raised (None: nothing failed yet); when it says the process is
    gone, that is the answer. Otherwise the actor is asked ``probe()`` (a method without
    arguments: ``ping``, ``stats``): an answer within ``timeout_s`` seconds means alive; a dead
    actor or no answer means dead."""
    how = actor_died(exc) if exc is not None else None
    if how is not None:
        return how
    try:
        await asyncio.wait_for(getattr(handle, probe).remote(), timeout_s)
        return None
    except Exception as probe_exc:  # noqa: BLE001 - a dead actor, a crashed engine, no answer
        return actor_died(probe_exc) or f"it does not answer ({type(probe_exc).__name__}: {str(probe_exc)[:160]})"


class Replacements:
    """The replacements of one kind of actor in a run.

    ``metric``: the field of each replacement's event (``rollout_worker_restarts``: 1);
    ``max_restarts``: replacements allowed in the run (None: no bound); ``setting``: the recipe
    key that sets it, named when the bound stops the run; ``error``: what a refusal or a failed
    replacement raises; ``startup_timeout_s``: the longest wait for a new actor to start."""

    def __init__(
        self, *, metric: str, log: EventLog, max_restarts: int | None = None, setting: str = "",
        error: type[AgentRLError] = InfraError, startup_timeout_s: float = 300.0,
    ) -> None:
        self.metric = metric
        self.log = log
        self.max_restarts = max_restarts
        self.setting = setting
        self.error = error
        self.startup_timeout_s = startup_timeout_s
        self.count = 0
        """Replacements done so far."""

    async def replace(
        self, name: str, old: Any, how: str, start: Callable[[], Awaitable[Any]], *,
        teardown: Callable[[], Awaitable[None]] | None = None, said: str | Callable[[], str] | None = None,
    ) -> Any:
        """Replace ``old`` (called ``name`` in words: "rollout worker 0"), which died ``how``:
        kill it, ``teardown()`` what it held outside its process, ``start()`` the new one (within
        ``startup_timeout_s``), count it and report it (``said``: the event's words, or a
        function giving them after the start; default "NAME died (HOW); replaced by a new one").
        Returns the new actor.

        Raises:
            error: the bound is spent (naming the setting and what to do), or the new actor did
                not start (saying why).
        """
        if self.max_restarts is not None and self.count >= self.max_restarts:
            raise self.error(
                f"{name} died ({how}) after {self.count} replacements in this run ({self.setting} = {self.max_restarts}; "
                "raise it, or rerun the same command: it resumes from the newest checkpoint)"
            )
        kill(old)
        if teardown is not None:
            await teardown()
        try:
            new = await timed(start(), self.startup_timeout_s, f"replacing {name}", self.error)
        except self.error:
            raise
        except Exception as exc:  # noqa: BLE001 - the new actor failed in its constructor or start-up
            raise self.error(f"{name} died ({how}) and its replacement failed to start: {type(exc).__name__}: {str(exc)[:300]}") from exc
        self.count += 1
        words = said() if callable(said) else said
        self.log.event(words or f"{name} died ({how}); replaced by a new one", **{self.metric: 1})
        return new


class ActorSlots:
    """Actors of one kind in numbered slots (``slots()``: the live list, written in place), each
    replaced in its slot when found dead.

    ``name``: the kind in words ("rollout worker": slot i is "rollout worker i"); ``start(i)``: a new
    actor for slot ``i``, started and answering; ``teardown(i)``: release what the dead actor of
    slot ``i`` held outside its process (None: nothing); ``probe``: the method asked to tell the
    living from the dead, with ``probe_timeout_s``; ``hand_over(slots)``: give the new set to the
    actors that call them (None: they read ``slots()`` themselves); ``consequence``: words added
    to each replacement's event (what became of the dead actor's work); ``indexed``: name a slot
    with its number ("rollout worker 0"); False for a kind with one actor ("reward model")."""

    def __init__(
        self, *, name: str, slots: Callable[[], list[Any]], start: Callable[[int], Awaitable[Any]], replacements: Replacements,
        probe: str = "ping", probe_timeout_s: float = 30.0, teardown: Callable[[int], Awaitable[None]] | None = None,
        hand_over: Callable[[list[Any]], Awaitable[None]] | None = None, consequence: str = "", indexed: bool = True,
    ) -> None:
        self.name = name
        self.slots = slots
        self.start = start
        self.replacements = replacements
        self.probe = probe
        self.probe_timeout_s = probe_timeout_s
        self.teardown = teardown
        self.hand_over = hand_over
        self.consequence = consequence
        self.indexed = indexed
        self._lock = asyncio.Lock()

    @property
    def restarts(self) -> int:
        """Replacements done so far (it only grows: a caller compares it before and after)."""
        return self.replacements.count

    async def lost(self, handle: Any, exc: BaseException | None = None) -> bool:
        """A call into ``handle`` failed (raising ``exc``): whether it is dead (then it is
        replaced now, or was already by an earlier call). Raises the replacements' error when
        the bound is spent or the new one does not start."""
        async with self._lock:  # one replacement at a time; its other callers find it done
            index = next((i for i, h in enumerate(self.slots()) if h is handle), None)
            if index is None:
                return True  # replaced already (or not one of ours any more)
            how = await how_dead(handle, self.probe, exc, self.probe_timeout_s)
            if how is None:
                return False  # alive: the call failed for its own reasons
            await self._replace(index, how)
            return True

    async def check(self) -> int:
        """Ask every actor ``probe()``; replace those found dead. How many were replaced."""
        async with self._lock:
            slots = self.slots()
            found = await asyncio.gather(*[how_dead(h, self.probe, None, self.probe_timeout_s) for h in slots])
            dead = [(i, how) for i, how in enumerate(found) if how is not None]
            for i, how in dead:
                await self._replace(i, how)
            return len(dead)

    async def _replace(self, index: int, how: str) -> None:
        slots = self.slots()
        name = f"{self.name} {index}" if self.indexed else self.name
        teardown = (lambda: self.teardown(index)) if self.teardown is not None else None  # type: ignore[misc]
        said = f"{name} died ({how}); replaced by a new one" + (f", {self.consequence}" if self.consequence else "")
        slots[index] = await self.replacements.replace(name, slots[index], how, lambda: self.start(index), teardown=teardown, said=said)
        if self.hand_over is not None:
            await self.hand_over(slots)
