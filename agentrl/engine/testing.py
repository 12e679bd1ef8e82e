"""In-process doubles of the engine's actors, shipped beside the seam they stand in for (as
httpx ships ``MockTransport``): with them the loop, the ledger, the fleet and learner failover run
in unit tests without Ray, vLLM or torch.distributed, in seconds.

The seam is the actor *handle*: the engine calls ``handle.method.remote(*args)`` and awaits the
result. :func:`local_actor` wraps any object so that its methods answer such calls in the event
loop; :meth:`LocalActor.kill` makes every later call fail the way a dead Ray actor's does.

- :class:`FakeGenerator` implements :class:`~agentrl.engine.common.interfaces.Generator`: it "generates"
  a fixed number of tokens labelled with the version it serves.
- :class:`FakeWorker` plays groups of one-turn episodes on its generators (reward from the row),
  and reports the episodes of a dead generator as infrastructure failures, as the real worker does.
- :class:`FakeLearner` records what it trained; it writes version folders, checkpoints and
  exports as small marker files, so the run-directory logic is the real one.
- :class:`FakeRewardModel` scores every item 0.5; :class:`FakeTokenizer` decodes ids as numbers, so
  that the real :class:`~agentrl.engine.rewards.scoring.EpisodeScorer` judges a fake worker's episodes.
- Hooks for :class:`~agentrl.engine.loop.loop.RLLoop`: :class:`KillGenerator`, :class:`KillLearner`,
  :class:`KillWorker`, :class:`KillRewardActor`; :class:`FakeRun`, a whole run over the fakes.

The doubles themselves are in :mod:`agentrl.engine.fakes`; this module re-exports them, so tests
import everything from here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrl.engine.common.cluster import kill
from agentrl.engine import fakes
from agentrl.engine.fakes import FakeActorDied, LocalActor, FakeGenerator, ScriptedGenerator, FakeTokenizer, FakeRewardModel, FakeWorker, FakeLearner, FakeCritic, local_actor

__all__ = [*fakes.__all__, "FakeRun", "KillGenerator", "KillLearner", "KillRewardActor", "KillWorker"]


class KillGenerator:
    """Loop hook: kill generator ``index`` once the learner reached ``after_step`` and groups are
    in flight (as if its node was lost)."""

    def __init__(self, after_step: int, index: int = 0) -> None:
        self.step, self.index = after_step, index
        self.done = False

    async def on_round(self, loop: Any) -> None:
        if not self.done and loop.version >= self.step and loop.pending:
            loop.log.event(f"fault injection: killing generator {self.index} after step {loop.version}")
            kill(loop.fleet.generators[self.index])
            self.done = True

    async def after_step(self, loop: Any) -> None:
        return None


class KillWorker:
    """Loop hook: kill rollout worker ``index`` once the learner reached ``after_step`` and
    groups are in flight (as if its process was SIGKILLed); ``times`` kills in all, each at a
    later step than the one before."""

    def __init__(self, after_step: int, index: int = 0, times: int = 1) -> None:
        self.step, self.index, self.left = after_step, index, times
        self.killed: list[Any] = []
        """The handles killed, in order."""

    async def on_round(self, loop: Any) -> None:
        if self.left and loop.version >= self.step and loop.pending:
            loop.log.event(f"fault injection: killing rollout worker {self.index} after step {loop.version}")
            handle = loop.fleet.workers[self.index]
            kill(handle)
            self.killed.append(handle)
            self.left -= 1
            self.step = loop.version + 1

    async def after_step(self, loop: Any) -> None:
        return None


class KillRewardActor:
    """Loop hook: kill the reward actor ``which`` (``"judge"``: a separate judge's generator
    ``index``; ``"reward_model"``) once the learner reached ``after_step`` and groups are in flight.
    ``handles()``: the actors of that kind (default: the loop's replaceable ones)."""

    def __init__(self, after_step: int, which: str, index: int = 0, handles: Callable[[], list[Any]] | None = None) -> None:
        self.step, self.which, self.index, self.handles = after_step, which, index, handles
        self.killed: list[Any] = []
        """The handles killed."""

    async def on_round(self, loop: Any) -> None:
        if not self.killed and loop.version >= self.step and loop.pending:
            loop.log.event(f"fault injection: killing the {self.which} actor {self.index} after step {loop.version}")
            handle = (self.handles() if self.handles is not None else loop.reward_actors[self.which].slots())[self.index]
            kill(handle)
            self.killed.append(handle)

    async def after_step(self, loop: Any) -> None:
        return None


class KillLearner:
    """Loop hook: kill learner rank ``rank`` (``critic=True``: PPO's critic rank) right after step
    ``after_step`` was logged (so the next step, or the checkpoint after it, finds it dead)."""

    def __init__(self, after_step: int, rank: int = 0, critic: bool = False) -> None:
        self.step, self.rank, self.critic = after_step, rank, critic
        self.done = False

    async def on_round(self, loop: Any) -> None:
        return None

    async def after_step(self, loop: Any) -> None:
        if not self.done and loop.version >= self.step:
            group = loop.critic.group if self.critic else loop.learners
            kill(group.handles[self.rank])
            self.done = True


class FakeRun:
    """The engine's real parts — ledger, staleness queue, fleet, publisher, learner group, loop,
    checkpoints, failover — over the fakes above, in one directory ``root``. For tests::

        run = FakeRun(tmp_path, rows=[{"reward": 1.0}] * 8, max_steps=3)
        loop = asyncio.run(run.run())

    ``worker``: keyword arguments of every :class:`FakeWorker`; ``learner``: of every
    :class:`FakeLearner`; ``critic``: of a :class:`FakeCritic` group, which makes the run PPO's
    (``advantage = "gae"``, with ``critic_warmup`` warm-up steps; None: GRPO); ``state``: a
    checkpoint's run state to resume from (None: the start); ``dynamic_sampling``,
    ``max_sampling_factor``, ``solved_reward``: as the recipe's ``[algo]`` keys (refill sets
    groups without a learning signal aside in the queue); ``worker_restarts``: replace a dead
    rollout worker at most this many times (:mod:`agentrl.engine.loop.rollout_failover`; None:
    no replacement, its groups are only lost); ``colocated``, ``sleep_level``, ``offload_learner``: as
    :class:`~agentrl.engine.loop.loop.LoopSettings` (generators and learner take turns);
    ``judges``: a separate judge's fake generators that score every episode, ``reward_model``: a
    :class:`FakeRewardModel` that does too; ``reward_restarts``: replace a dead one of them at most
    this many times (None: no replacement, :mod:`agentrl.engine.rewards.reward_actors`);
    ``start_model``: the folder RL starts from, for a learner death before the first checkpoint
    (None: such a death is an error); ``background_checkpoints``: the ranks write checkpoints in
    the background (``checkpoint.background``).
    """

    def __init__(
        self, root: Path, *, rows: list[dict[str, Any]], batch_size: int = 4, group_size: int = 2, max_staleness: int = 1,
        max_steps: int = 3, num_generators: int = 1, num_workers: int = 1, checkpoint_every: int = 0, max_restarts: int = 0,
        worker: dict[str, Any] | None = None, learner: dict[str, Any] | None = None, hooks: list[Any] | None = None,
        timeout_s: float = 30.0, max_degenerate_steps: int = 0, critic: dict[str, Any] | None = None, critic_warmup: int = 0,
        dynamic_sampling: str = "off", max_sampling_factor: float = 3.0, solved_reward: float = 1.0,
        worker_restarts: int | None = None, colocated: bool = False, sleep_level: int = 0, offload_learner: bool = False,
        judges: int = 0, reward_model: bool = False, reward_restarts: int | None = 2, start_model: str | None = None,
        background_checkpoints: bool = False,
    ) -> None:
        import functools

        import io

        from rich.console import Console

        from agentrl.engine.loop.batching import BatchSettings, no_signal_reason
        from agentrl.engine.generation.fleet import GeneratorFleet
        from agentrl.engine.generation.engine_config import EngineSettings
        from agentrl.engine.training.learner_group import LearnerGroup
        from agentrl.engine.loop.loop import LoopSettings
        from agentrl.engine.metrics import MetricsLogger
        from agentrl.engine.loop.publishing import WeightPublisher, WeightVersions
        from agentrl.engine.common.run_dir import RunDir

        self.run_dir = RunDir(Path(root))
        self.rows = rows
        self.batch_size, self.group_size, self.max_staleness = batch_size, group_size, max_staleness
        self.num_workers = num_workers
        self.checkpoint_every, self.max_restarts = checkpoint_every, max_restarts
        self.start_model = start_model
        self.background_checkpoints = background_checkpoints
        self.worker_kwargs = dict(worker or {})
        from agentrl.engine.rewards.reward_actors import RewardActors

        self.judges, self.with_reward_model, self.reward_restarts = judges, reward_model, reward_restarts
        self.rewards = RewardActors()
        """The fake judge generators and reward model, once started (replacements write here)."""
        self.reward_actors_made = 0
        self.worker_restarts = worker_restarts
        self.workers_made = 0
        self.hooks = list(hooks or [])
        self.console = io.StringIO()
        self.log = MetricsLogger(self.run_dir.root, console=Console(file=self.console, width=200), live=False)
        self.trained: list[tuple[int, list[str]]] = []
        """Every step any fake learner rank 0 took: ``(step, sample ids)`` (restarts included)."""
        self.generators_made = 0
        learner_kwargs = dict(learner or {})

        def make_generator(settings: Any, version: int, index: int) -> LocalActor:
            self.generators_made += 1
            return local_actor(FakeGenerator(version), f"generator {index}")

        self.learners = LearnerGroup(
            num_ranks=1, placement=None, timeout_s=timeout_s,
            factory=lambda rank, kwargs, options: local_actor(FakeLearner(rank=rank, trained=self.trained, **learner_kwargs), f"learner {rank}"),
        )
        self.workers: list[Any] = []
        """The run's rollout workers (the fleet's list), once started."""
        versions = WeightVersions(learners=self.learners, run_dir=self.run_dir, log=self.log, weight_sync="disk")
        self.fleet = GeneratorFleet(
            factory=make_generator, settings=EngineSettings(model=str(root)), count=num_generators, log=self.log,
            timeout_s=timeout_s, startup_timeout_s=timeout_s, weights=versions, workers=self.workers,
        )
        self.publisher = WeightPublisher(
            fleet=self.fleet, learners=self.learners, run_dir=self.run_dir, log=self.log, weight_sync="disk",
            sync_timeout_s=timeout_s, workers_per_generator=1, dtype="float32", keep_versions=3, versions=versions,
        )
        self.batch = BatchSettings(advantage="grpo" if critic is None else "gae", dynamic_sampling=dynamic_sampling, solved_reward=solved_reward)
        self.queue_kwargs: dict[str, Any] = {} if dynamic_sampling != "refill" else {
            "classify": functools.partial(no_signal_reason, settings=self.batch),
            "refill_groups": int((max_sampling_factor - 1) * (batch_size // group_size)),
        }
        """Refill's arguments of the staleness queue (none without refill), as ``wiring.queue_kwargs`` gives them."""
        self.critic_seen: list[tuple[int, list[str], list[float]]] = []
        """Every step a fake critic rank 0 trained: ``(step, sample ids, returns)``."""
        self.critic = None if critic is None else LearnerGroup(
            num_ranks=1, placement=None, timeout_s=timeout_s, name="critic",
            factory=lambda rank, kwargs, options: local_actor(FakeCritic(rank=rank, seen=self.critic_seen, **critic), f"critic {rank}"),
        )
        self.critic_warmup = critic_warmup
        self.settings = LoopSettings(
            max_steps=max_steps, group_size=group_size, episode_timeout_s=timeout_s, stuck_timeout_s=3 * timeout_s,
            checkpoint_every=checkpoint_every, max_degenerate_steps=max_degenerate_steps,
            colocated=colocated, sleep_level=sleep_level, offload_learner=offload_learner,
        )

    async def start(self, version: int = 0) -> None:
        """Start the fake generators, learner and workers (at weight ``version``)."""
        await self.fleet.start(version)
        await self.learners.start({})
        if self.critic is not None:
            await self.critic.start({})
        self.rewards.judge_generators = [self._spawn_reward_actor(("judge", i)) for i in range(self.judges)]
        self.rewards.reward_model = self._spawn_reward_actor(("reward_model", 0)) if self.with_reward_model else None
        self.workers[:] = [self._make_worker(i) for i in range(self.num_workers)]

    def _spawn_reward_actor(self, spec: tuple[str, int]) -> LocalActor:
        """A fake reward actor for ``spec`` (``(kind, index)``: this run's stand-in for an ActorSpec)."""
        self.reward_actors_made += 1
        kind, i = spec
        return local_actor(FakeGenerator(0) if kind == "judge" else FakeRewardModel(), f"{kind} {i}")

    def _make_worker(self, index: int) -> LocalActor:
        self.workers_made += 1
        return local_actor(FakeWorker(self.fleet.generators, **self.worker_kwargs, **self.rewards.worker_kwargs()), f"worker {index}")

    async def run(self, state: Any = None) -> Any:
        """Start, then run the loop (with learner failover) from ``state``; the finished loop."""
        from agentrl.engine.loop.checkpointing import RunCheckpointer
        from agentrl.engine.loop.critic_stage import CriticStage, GaeSettings
        from agentrl.engine.loop.failover import LearnerFailover
        from agentrl.engine.loop.loop_run import LoopRun

        await self.start(state.version if state is not None else 0)
        if state is not None:
            await self.learners.call("load_checkpoint", str(self.run_dir.checkpoint(state.version) / "learner"), what="loading the learner checkpoint")
            if self.critic is not None:
                await self.critic.call("load_checkpoint", str(self.run_dir.checkpoint(state.version) / "critic"), what="loading the critic checkpoint")
        checkpointer = RunCheckpointer(run_dir=self.run_dir, learners=self.learners, keep=2, tokenizer=None, log=self.log, critic=self.critic,
                                       background=self.background_checkpoints)
        failover = LearnerFailover(
            run_dir=self.run_dir, learners=self.learners, fleet=self.fleet, publisher=self.publisher,
            learner_kwargs=lambda weights: {}, max_restarts=self.max_restarts, log=self.log, critic=self.critic,
            critic_kwargs=lambda: {}, start=self.start_model,
        )
        stage = None if self.critic is None else CriticStage(group=self.critic, settings=GaeSettings(normalize=False, lam=1.0),
                                                            warmup_steps=self.critic_warmup)

        rollout_failover = None
        if self.worker_restarts is not None:
            from agentrl.engine.loop.rollout_failover import RolloutFailover

            async def start_worker(index: int) -> LocalActor:
                return self._make_worker(index)

            rollout_failover = RolloutFailover(workers=lambda: self.fleet.workers, start=start_worker,
                                               max_restarts=self.worker_restarts, log=self.log, ping_timeout_s=5.0)
        reward_slots = {}
        if self.reward_restarts is not None:
            from agentrl.engine.rewards.reward_actors import reward_actor_slots

            reward_slots = reward_actor_slots(
                self.rewards, [("judge", i) for i in range(self.judges)], ("reward_model", 0), workers=lambda: self.fleet.workers,
                log=self.log, judge_max_restarts=self.reward_restarts, rm_max_restarts=self.reward_restarts,
                startup_timeout_s=30.0, probe_timeout_s=5.0, spawn=self._spawn_reward_actor,
            )

        loop_run = LoopRun(
            rows=self.rows, fleet=self.fleet, publisher=self.publisher, learners=self.learners, log=self.log, run_dir=self.run_dir,
            batch=self.batch, settings=self.settings, checkpointer=checkpointer, failover=failover, hooks=self.hooks,
            critic=stage, rollout_failover=rollout_failover, reward_actors=reward_slots,
            queue_kwargs={"batch_size": self.batch_size, "group_size": self.group_size, "max_staleness": self.max_staleness,
                          **self.queue_kwargs},
            ledger_kwargs={"num_rows": len(self.rows), "group_size": self.group_size},
        )
        try:
            return await loop_run.run(state)
        finally:
            self.fleet.cancel_reload()
