"""The actors of model-based rewards: a separate judge model's generators and the reward model's
server, started (and checked) before the rollout workers that call them.

A separate judge's generators are frozen: they serve their model as version 0 for the whole run
and are never given weight updates, health checks or replacements (a judge that dies makes the
episodes it was to score infrastructure failures, each said in words). With ``judge.model =
"policy"`` there is no actor here: the rollout workers ask the policy's own generators.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from agentrl.engine.common.cluster import kill, new_actor
from agentrl.engine.common.waits import timed
from agentrl.errors import RewardModelError

__all__ = ["RewardActors", "start_reward_actors"]


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
