"""The actors of model-based rewards: a separate judge model's generators and the reward model's
server, started (and checked) before the rollout workers that call them.

A separate judge's generators are frozen: they serve their model as version 0 for the whole run
and are never given weight updates. A judge generator or the reward model whose process died is
replaced in-run (:func:`reward_actor_slots`, the engine's one replacement machinery
:mod:`agentrl.engine.common.replacement`): the episodes it was scoring are infrastructure
failures (never a reward of 0), the new handle goes to every rollout worker, at most
``reward.judge.max_restarts`` / ``reward.model.max_restarts`` times. With ``judge.model =
"policy"`` there is no actor here: the rollout workers ask the policy's own generators (the
fleet replaces those).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from collections.abc import Callable

from agentrl.engine.common.cluster import kill, new_actor
from agentrl.engine.common.replacement import ActorSlots, EventLog, Replacements, tell_workers
from agentrl.engine.common.waits import timed
from agentrl.engine.rewards.scoring import JUDGE, REWARD_MODEL
from agentrl.errors import RewardModelError

__all__ = ["RewardActors", "reward_actor_slots", "start_reward_actors"]


@dataclass
class RewardActors:
    """Handles of the reward actors of a run (empty: none)."""

    judge_generators: list[Any] = field(default_factory=list)
    """A separate judge model's generators (empty: the judge is the policy, or there is none)."""
    reward_model: Any = None
    """The reward model's server (None: no reward model)."""

    @property
    def handles(self) -> list[Any]:
        """Every actor, for shutting them down."""
        return [*self.judge_generators, *([self.reward_model] if self.reward_model is not None else [])]

    def worker_kwargs(self) -> dict[str, Any]:
        """The rollout workers' arguments that name these actors (none for what is absent)."""
        out: dict[str, Any] = {}
        if self.judge_generators:
            out["judge_generators"] = list(self.judge_generators)
        if self.reward_model is not None:
            out["reward_model"] = self.reward_model
        return out


async def start_reward_actors(judges: list[Any], reward_model: Any, *, startup_timeout_s: float, log: Any) -> RewardActors:
    """Start the judge generators (``judges``: :class:`~agentrl.engine.wiring.ActorSpec` of each)
    and the reward model (an ActorSpec or None) together, within ``startup_timeout_s``; report
    them on ``log``. Raises :class:`RewardModelError` when one cannot start."""
    actors = RewardActors(
        [new_actor(s.cls, s.options, *s.args, **s.kwargs) for s in judges],
        new_actor(reward_model.cls, reward_model.options, *reward_model.args, **reward_model.kwargs) if reward_model is not None else None,
    )
    if not actors.handles:
        return actors
    calls = [g.start.remote() for g in actors.judge_generators]
    if actors.reward_model is not None:
        calls.append(actors.reward_model.ping.remote())
    try:
        infos = await timed(asyncio.gather(*calls), startup_timeout_s, "reward actors' start-up", RewardModelError)
    except BaseException as exc:
        for h in actors.handles:  # nothing is left running when the start fails
            kill(h)
        if isinstance(exc, Exception) and not isinstance(exc, RewardModelError):  # a model that cannot load, a dead actor
            raise RewardModelError(f"a judge generator or the reward model could not start: {type(exc).__name__}: {exc}") from exc
        raise
    if actors.judge_generators:
        log.event(f"judge generators ready: {infos[: len(actors.judge_generators)]}")
    if actors.reward_model is not None:
        log.event(f"reward model ready: {reward_model.args[0]}")
    return actors


def _spawn(spec: Any) -> Any:
    return new_actor(spec.cls, spec.options, *spec.args, **spec.kwargs)


async def _started(handle: Any, call: str) -> Any:
    """``handle`` once ``call()`` answered; killed when it failed or the wait was given up."""
    try:
        await getattr(handle, call).remote()
    except BaseException:
        kill(handle)
        raise
    return handle




def reward_actor_slots(
    actors: RewardActors, judges: list[Any], reward_model: Any, *, workers: Callable[[], list[Any]], log: EventLog,
    judge_max_restarts: int, rm_max_restarts: int, startup_timeout_s: float, probe_timeout_s: float = 30.0,
    spawn: Callable[[Any], Any] | None = None,
) -> dict[str, ActorSlots]:
    """The replaceable reward actors of ``actors``, by the scorer name an episode's
    ``info["reward_failure"]`` gives them (``judge``, ``reward_model``); none for what is absent.

    ``judges`` / ``reward_model``: the ActorSpecs they were started from (a replacement is started
    the same way); ``workers()``: the rollout workers, told each new handle; ``log``: where each
    replacement is one event (``judge_generator_restarts`` / ``reward_model_restarts``) and one
    console line. A replacement past the bound, or one that does not start, raises
    :class:`RewardModelError` naming the setting. ``spawn(spec)``: a new actor of a spec, not yet
    started (None: a Ray actor; tests pass in-process doubles)."""
    spawn = spawn or _spawn
    out: dict[str, ActorSlots] = {}
    consequence = "the episodes it was scoring are infrastructure failures (their groups re-issued when none is left)"
    if actors.judge_generators:
        async def start_judge(i: int) -> Any:
            return await _started(spawn(judges[i]), "start")

        async def hand_judges(slots: list[Any]) -> None:
            await tell_workers(workers(), "set_judge_generators", list(slots))

        out[JUDGE] = ActorSlots(
            name="judge generator", slots=lambda: actors.judge_generators, start=start_judge, probe="stats",
            probe_timeout_s=probe_timeout_s, hand_over=hand_judges, consequence=consequence,
            replacements=Replacements(metric="judge_generator_restarts", log=log, max_restarts=judge_max_restarts,
                                      setting="reward.judge.max_restarts", error=RewardModelError, startup_timeout_s=startup_timeout_s),
        )
    if actors.reward_model is not None:
        slot = [actors.reward_model]

        async def start_rm(i: int) -> Any:
            return await _started(spawn(reward_model), "ping")

        async def hand_rm(slots: list[Any]) -> None:
            actors.reward_model = slots[0]  # shut down with the others at the end
            await tell_workers(workers(), "set_reward_model", slots[0])

        out[REWARD_MODEL] = ActorSlots(
            name="reward model", slots=lambda: slot, start=start_rm, probe="ping", probe_timeout_s=probe_timeout_s,
            hand_over=hand_rm, consequence=consequence, indexed=False,
            replacements=Replacements(metric="reward_model_restarts", log=log, max_restarts=rm_max_restarts,
                                      setting="reward.model.max_restarts", error=RewardModelError, startup_timeout_s=startup_timeout_s),
        )
    return out
