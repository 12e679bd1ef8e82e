"""The one replacement machinery (agentrl.engine.common.replacement) with in-process actors: what
counts as dead (Ray says so, or no answer to the probe in time; a failed call on a live actor is
not), the bound and its words, a replacement that does not start, and the hand-over."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentrl.engine.common.replacement import ActorSlots, Replacements, how_dead
from agentrl.engine.testing import local_actor
from agentrl.errors import InfraError, RewardModelError


class _Log:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def event(self, message: str, **fields: Any) -> None:
        self.events.append((message, fields))


class _Pinged:
    def __init__(self, hang: bool = False) -> None:
        self.hang = hang

    async def ping(self) -> bool:
        if self.hang:
            await asyncio.sleep(60)
        return True


def test_how_dead_tells_the_dead_the_hung_and_the_living():
    async def go() -> list[str | None]:
        alive, hung, dead = local_actor(_Pinged()), local_actor(_Pinged(hang=True)), local_actor(_Pinged(), "rm")
        dead.kill()
        return [
            await how_dead(alive, "ping", RuntimeError("the call failed for its own reasons"), timeout_s=1.0),
            await how_dead(hung, "ping", timeout_s=0.2),
            await how_dead(dead, "ping", timeout_s=1.0),
        ]

    alive, hung, dead = asyncio.run(go())
    assert alive is None
    assert hung is not None and hung.startswith("it does not answer (TimeoutError")
    assert dead == "killed by the test (SIGKILL)"


def _slots(actors: list[Any], log: _Log, max_restarts: int | None, start=None, handed: list | None = None) -> ActorSlots:
    async def default_start(i: int) -> Any:
        return local_actor(_Pinged(), f"new {i}")

    async def hand_over(slots: list[Any]) -> None:
        if handed is not None:
            handed.append(list(slots))

    return ActorSlots(
        name="thing", slots=lambda: actors, start=start or default_start, probe="ping", probe_timeout_s=0.2,
        hand_over=hand_over, consequence="its work is re-done",
        replacements=Replacements(metric="thing_restarts", log=log, max_restarts=max_restarts, setting="things.max_restarts",
                                  error=RewardModelError, startup_timeout_s=5.0),
    )


def test_check_replaces_only_the_dead_and_the_hung_hands_the_set_over_and_says_so():
    log, handed = _Log(), []
    actors = [local_actor(_Pinged(), "a"), local_actor(_Pinged(hang=True), "b"), local_actor(_Pinged(), "c")]
    actors[2].kill()
    first = list(actors)
    slots = _slots(actors, log, max_restarts=2, handed=handed)
    assert asyncio.run(slots.check()) == 2
    assert actors[0] is first[0] and actors[1] is not first[1] and actors[2] is not first[2]
    assert first[1].dead  # the hung one was stopped for good
    assert handed and handed[-1] == actors
    assert [m for m, _ in log.events] == [
        "thing 1 died (it does not answer (TimeoutError: )); replaced by a new one, its work is re-done",
        "thing 2 died (killed by the test (SIGKILL)); replaced by a new one, its work is re-done",
    ]
    assert all(f == {"thing_restarts": 1} for _, f in log.events)
    assert slots.restarts == 2
    assert asyncio.run(slots.check()) == 0  # all alive now: nothing more


def test_a_failed_call_on_a_live_actor_is_no_death_and_a_second_report_finds_it_replaced():
    log = _Log()
    actors = [local_actor(_Pinged(), "a")]
    slots = _slots(actors, log, max_restarts=1)
    old = actors[0]
    assert asyncio.run(slots.lost(old, RuntimeError("bad input"))) is False and log.events == []
    old.kill()
    assert asyncio.run(slots.lost(old, None)) is True and len(log.events) == 1
    assert asyncio.run(slots.lost(old, None)) is True and len(log.events) == 1  # already replaced: once


def test_the_bound_stops_with_the_setting_named():
    log = _Log()
    actors = [local_actor(_Pinged(), "a")]
    actors[0].kill()
    with pytest.raises(RewardModelError, match=r"^thing 0 died \(killed by the test \(SIGKILL\)\) after 0 replacements in this run "
                                               r"\(things.max_restarts = 0; raise it, or rerun the same command"):
        asyncio.run(_slots(actors, log, max_restarts=0).check())
    assert log.events == []


def test_a_replacement_that_does_not_start_is_an_error_in_words():
    async def broken(i: int) -> Any:
        raise OSError("no such model")

    actors = [local_actor(_Pinged(), "a")]
    actors[0].kill()
    with pytest.raises(RewardModelError, match=r"thing 0 died .* and its replacement failed to start: OSError: no such model"):
        asyncio.run(_slots(actors, _Log(), max_restarts=2, start=broken).check())


def test_replacements_default_to_an_infra_error():
    assert Replacements(metric="m", log=_Log()).error is InfraError


class _Worker:
    def __init__(self, fail: Exception | None = None) -> None:
        self.got: list[object] = []
        self.fail = fail

    def set_generators(self, generators: object) -> None:
        if self.fail is not None:
            raise self.fail
        self.got.append(generators)


def test_telling_the_workers_skips_a_dead_one_and_reaches_the_live_ones():
    import anyio

    from agentrl.engine.common.replacement import tell_workers
    from agentrl.engine.testing import local_actor

    live, dead = _Worker(), _Worker()
    handles = [local_actor(dead, "rollout-0"), local_actor(live, "rollout-1")]
    handles[0].kill()
    anyio.run(tell_workers, handles, "set_generators", ["g1"])
    assert live.got == [["g1"]] and dead.got == []


def test_telling_the_workers_raises_a_live_workers_own_failure():
    import anyio
    import pytest

    from agentrl.engine.common.replacement import tell_workers
    from agentrl.engine.testing import local_actor

    handles = [local_actor(_Worker(), "rollout-0"), local_actor(_Worker(fail=ValueError("bad generators")), "rollout-1")]
    with pytest.raises(ValueError, match="bad generators"):
        anyio.run(tell_workers, handles, "set_generators", ["g1"])
