"""One RL stage of a run: the loop from a run state, started again from a recovered state when a
learner or critic rank dies.

:class:`LoopRun` holds what lives for the whole stage (the generation side, the learner and critic
groups, the checkpointer, both failovers, the hooks and the replaceable reward actors) and builds
what each attempt starts afresh: the staleness queue, the prompt ledger (restored from the state
the attempt goes on from) and the :class:`~agentrl.engine.loop.loop.RLLoop`. The run's controller
and the in-process test run (:mod:`agentrl.engine.testing`) both run their loop through it, so the
two cannot put the loop together differently.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrl.engine.common.replacement import ActorSlots
from agentrl.engine.common.run_dir import RunDir
from agentrl.engine.generation.fleet import GeneratorFleet
from agentrl.engine.loop.batching import BatchSettings
from agentrl.engine.loop.checkpointing import RunCheckpointer
from agentrl.engine.loop.critic_stage import CriticStage
from agentrl.engine.loop.evaluation import Evaluator
from agentrl.engine.loop.failover import LearnerFailover, run_with_failover
from agentrl.engine.loop.ledger import PromptLedger
from agentrl.engine.loop.loop import LoopHook, LoopSettings, RLLoop
from agentrl.engine.loop.publishing import WeightPublisher
from agentrl.engine.loop.rollout_failover import RolloutFailover
from agentrl.engine.loop.run_state import RunState
from agentrl.engine.loop.staleness import StalenessQueue
from agentrl.engine.training.learner_group import LearnerGroup
from agentrl.errors import LearnerDied

__all__ = ["LoopRun"]


@dataclass
class LoopRun:
    """The RL stage over ``rows`` (the training prompts).

    ``queue_kwargs``: :class:`StalenessQueue`'s arguments; ``ledger_kwargs``:
    :class:`PromptLedger`'s (both made again for every attempt). ``failover``: restarts dead
    learner (and critic) ranks and gives the state to go on from; None: a dead rank ends the run.
    ``evaluator``: the held-out evaluation (None: none); a resumed attempt takes its records from
    the state. ``critic``: PPO's critic stage (None: GRPO). ``rollout_failover``: replaces dead
    rollout workers (None: a dead worker's groups are lost to the run's error). ``reward_actors``:
    the replaceable judge and reward-model slots, by scorer name."""

    rows: list[dict[str, Any]]
    fleet: GeneratorFleet
    publisher: WeightPublisher
    learners: LearnerGroup
    log: Any
    run_dir: RunDir
    batch: BatchSettings
    settings: LoopSettings
    queue_kwargs: dict[str, Any]
    ledger_kwargs: dict[str, Any]
    checkpointer: RunCheckpointer
    failover: LearnerFailover | None = None
    evaluator: Evaluator | None = None
    hooks: Sequence[LoopHook] = ()
    critic: CriticStage | None = None
    rollout_failover: RolloutFailover | None = None
    reward_actors: Mapping[str, ActorSlots] = field(default_factory=dict)

    async def run(self, state: RunState | None = None) -> RLLoop:
        """Run the loop from ``state`` (None: the start) to its end; the finished loop (of the last
        attempt, after any learner restarts)."""
        return await run_with_failover(self._attempt, self.failover, state)

    async def _attempt(self, at: RunState | None) -> RLLoop:
        """One run of the loop from ``at`` (None: the start), with a fresh queue and ledger."""
        queue = StalenessQueue(**self.queue_kwargs)
        ledger = PromptLedger.restore(at, queue, **self.ledger_kwargs) if at is not None else PromptLedger(**self.ledger_kwargs)
        if self.evaluator is not None and at is not None:
            self.evaluator.records = list(at.evals)
        loop = RLLoop(
            rows=self.rows, queue=queue, ledger=ledger, fleet=self.fleet, publisher=self.publisher, learners=self.learners,
            batch=self.batch, settings=self.settings, log=self.log, run_dir=self.run_dir,
            checkpoint=self.checkpointer.save, finish_checkpoint=self.checkpointer.finish, evaluate=self.evaluator, version=at.version if at is not None else 0,
            hooks=list(self.hooks), critic=self.critic, rollout_failover=self.rollout_failover, reward_actors=self.reward_actors,
        )
        self.checkpointer.drop()  # one an earlier attempt was writing when its rank died: never finished
        try:
            await loop.run()
        except LearnerDied:
            raise  # its checkpoint in the background is dropped by the next attempt, or stays hidden
        except BaseException:  # a stop (Ctrl-C) or an error: keep what the ranks are writing
            await self._finish_checkpoint_after_error()
            raise
        return loop

    async def _finish_checkpoint_after_error(self) -> None:
        """Put a checkpoint being written in the background in place as the loop stops on an
        error or a stop, so that a resume goes on from it; if that fails too, it is dropped and
        the loop's own error is the one reported."""
        if self.checkpointer.pending is None:
            return
        try:
            await asyncio.shield(self.checkpointer.finish())
        except BaseException as exc:  # noqa: BLE001 - the loop's error is the one that matters
            self.log.event(f"the checkpoint being written when the loop stopped was dropped: {exc}")
