"""Learner failover: when a learner rank or (PPO with ``algo.advantage = "gae"``) a critic rank dies
mid-run, restart the learner group, and the critic group with it, from the newest checkpoint in
the same process and go on.

What a restart does, in order: stop waiting for a weight load in progress; kill every rank (the
survivors are stuck in a collective with the dead one); leave the weight-transfer group (versions
go through disk from now on); read the newest checkpoint's run state; drop the log records and
weight folders of the steps after it (they are trained again); start the ranks on the
checkpoint's weights and load its learner state; the critic goes back to the checkpoint's critic
state too (its ranks started anew when one of them died: the checkpoint holds the critic's
weights and optimiser in ``critic/``); load the checkpoint's weights into the
generators (version N again). The learner and the critic share one bound,
``learner.max_restarts``. The caller then rebuilds the ledger and the queue from the state:
groups in flight or finished after the checkpoint are dropped and their prompts issued again, so
none is lost and none is trained twice.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from agentrl.engine.generation.fleet import EventLog, GeneratorFleet
from agentrl.engine.training.learner_group import LearnerGroup
from agentrl.engine.loop.publishing import WeightPublisher
from agentrl.engine.common.run_dir import RunDir
from agentrl.engine.loop.run_state import (
    RunState,
    latest_checkpoint,
    link_tree,
    read_state,
    truncate_logs,
)
from agentrl.errors import LearnerDied, LearnerError

__all__ = ["LearnerFailover", "run_with_failover"]


class LearnerFailover:
    """Restarts ``learners`` from the newest checkpoint of ``run_dir`` at most ``max_restarts``
    times. ``learner_kwargs(model)`` gives the ranks' arguments to start from the weights folder
    ``model``. ``critic``: PPO's critic group, rewound to the checkpoint's critic state with the
    learner (None: no critic); ``critic_kwargs()``: its ranks' arguments (the RL starting point),
    to start them anew when one of them died. ``start``: the weights folder RL starts from (full
    fine-tuning): before the first checkpoint a death restarts the learner (and the critic) from
    it at step 0, as a checkpoint of step 0 would; None (LoRA, whose versions are adapters): a
    death before the first checkpoint is an error in words."""

    def __init__(
        self, *, run_dir: RunDir, learners: LearnerGroup, fleet: GeneratorFleet, publisher: WeightPublisher,
        learner_kwargs: Callable[[str], dict[str, Any]], max_restarts: int, log: EventLog,
        critic: LearnerGroup | None = None, critic_kwargs: Callable[[], dict[str, Any]] | None = None,
        start: str | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.start = start
        self.learners = learners
        self.critic = critic
        self.critic_kwargs = critic_kwargs
        self.fleet = fleet
        self.publisher = publisher
        self.learner_kwargs = learner_kwargs
        self.max_restarts = max_restarts
        self.log = log
        self.restarts = 0
        """Restarts done so far."""

    async def recover(self, died: LearnerDied) -> RunState | None:
        """Restart the learner (and PPO's critic) after ``died``; the run state to go on from
        (None: the start of RL, when no checkpoint exists yet and ``start`` is known). Raises
        LearnerError (naming the rank, how it died, the newest checkpoint and how to resume) when
        there is nothing to restart from or the restarts are spent."""
        ckpt = latest_checkpoint(self.run_dir.root)
        self.fleet.cancel_reload()
        self.learners.kill()
        critic_died = self.critic is not None and getattr(died, "group", "learner") == "critic"
        if critic_died:
            self.critic.kill()  # type: ignore[union-attr]  # its survivors are stuck in a collective with the dead rank
        both = "the learner and the critic" if self.critic is not None else "the learner"
        if ckpt is None and self.start is not None and self.restarts < self.max_restarts and (self.critic is None or self.critic_kwargs is not None):
            return await self._restart_at_the_start(died, both)
        if ckpt is None:
            raise LearnerError(
                f"{died}; there is no checkpoint to restart {both} from yet (the first is written after learner step 1 "
                f"unless checkpoint.first_step = false; then by checkpoint.every_minutes, every_steps and at_eval); "
                f"rerunning the same `agentrl train` command starts the run again"
            ) from died
        if self.restarts >= self.max_restarts:
            raise LearnerError(
                f"{died}; {both} were already restarted {self.restarts} time(s) (learner.max_restarts = "
                f"{self.max_restarts}); the newest checkpoint is {ckpt}: rerunning the same `agentrl train` command "
                "resumes from it"
            ) from died
        if critic_died and self.critic_kwargs is None:
            raise LearnerError(f"{died}; this run cannot start the critic again (no critic arguments): rerunning the same "
                               f"`agentrl train` command resumes from {ckpt}") from died
        self.restarts += 1
        state = read_state(ckpt)
        self.log.event(
            f"{died}; restarting {both} from checkpoint {ckpt.name} (restart {self.restarts} of {self.max_restarts})",
            learner_restarts=1, step=state.version, **({"critic_restarts": 1} if critic_died else {}),
        )
        self.publisher.transfer_lost("the learner restarted")
        truncate_logs(self.run_dir.root, state.version)
        self._rewind_versions(state.version, ckpt / "weights")
        starts = [self.learners.start(self.learner_kwargs(str(ckpt / "weights")), what="restarting the learner")]
        if critic_died:  # the critic's ranks start from the RL starting point, then load their checkpoint
            starts.append(self.critic.start(self.critic_kwargs(), what="restarting the critic"))  # type: ignore[union-attr, misc]
        await asyncio.gather(*starts)
        await self.learners.call("load_checkpoint", str(ckpt / "learner"), what="loading the learner checkpoint")
        if self.critic is not None and (ckpt / "critic").is_dir():  # the critic goes back to the same step (a
            # checkpoint of a run without the critic has none: the critic then goes on as a resume from it starts it)
            await self.critic.call("load_checkpoint", str(ckpt / "critic"), what="loading the critic checkpoint")
        folder = self.run_dir.weights_version(state.version)
        await self.fleet.load(state.version, folder)
        self.fleet.mark_published(state.version)
        self.log.event(f"{both} restarted at version {state.version}; generators serve it again", step=state.version)
        return state

    async def _restart_at_the_start(self, died: LearnerDied, both: str) -> RunState | None:
        """No checkpoint yet: start the learner (and the critic, which may have trained on the
        lost step) from the RL starting point, drop every version published since, and have the
        generators serve the starting weights again as version 0."""
        self.restarts += 1
        self.log.event(
            f"{died}; no checkpoint yet: restarting {both} from the RL starting point at step 0 "
            f"(restart {self.restarts} of {self.max_restarts})",
            learner_restarts=1, step=0, **({"critic_restarts": 1} if self.critic is not None else {}),
        )
        self.publisher.transfer_lost("the learner restarted")
        truncate_logs(self.run_dir.root, 0)
        self._rewind_versions(0, Path(self.start))  # type: ignore[arg-type]
        starts = [self.learners.start(self.learner_kwargs(str(self.start)), what="restarting the learner")]
        if self.critic is not None:
            self.critic.kill()
            starts.append(self.critic.start(self.critic_kwargs(), what="restarting the critic"))  # type: ignore[misc]
        await asyncio.gather(*starts)
        await self.fleet.load(0, Path(self.start))  # type: ignore[arg-type]
        self.fleet.mark_published(0)
        self.log.event(f"{both} restarted at step 0; generators serve the starting weights again", step=0)
        return None

    def _rewind_versions(self, version: int, weights: Path) -> None:
        """Drop published folders newer than ``version``; put the checkpoint's ``weights`` back as
        version ``version`` when it was pruned (replacement generators start from it)."""
        for v in self.run_dir.versions_on_disk():
            if v > version:
                shutil.rmtree(self.run_dir.weights_version(v), ignore_errors=True)
        folder = self.run_dir.weights_version(version)
        if version > 0 and not folder.exists():
            link_tree(weights, folder)


async def run_with_failover(run: Callable[[RunState | None], Awaitable[Any]], failover: LearnerFailover | None, state: RunState | None) -> Any:
    """``await run(state)``; when a learner or critic rank dies and ``failover`` can restart them, run again
    from the state it recovered (and so on); without ``failover`` the death propagates."""
    while True:
        try:
            return await run(state)
        except LearnerDied as died:
            if failover is None:
                raise
            while True:  # a rank of the other group may die during the restart itself: restart again (bounded)
                try:
                    state = await failover.recover(died)
                    break
                except LearnerDied as again:
                    died = again
