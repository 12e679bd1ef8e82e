"""Assembly: the run's parts built from its recipe, so that the controller only orders stages.

:class:`Assembly` reads the recipe (through :mod:`agentrl.engine.wiring`) for every part the
controller uses: the learner and critic rank groups and their placement, the generator fleet with
its weight versions and the run's rollout workers, the publisher, the judge and reward-model
actors, the rollout workers themselves (:class:`RolloutWorkers`), the held-out evaluator, the
metric sinks and the RL stage (:class:`~agentrl.engine.loop.loop_run.LoopRun`: checkpointer,
critic stage, learner and rollout-worker failover, queue and ledger). Parts are built when the
controller asks, because some need what an earlier stage made (the model after SFT, the placement
once Ray is up); each is given what it needs in its constructor, none is wired to another
afterwards.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from agentrl.config import Recipe
from agentrl.engine import wiring
from agentrl.engine.common.cluster import new_actor
from agentrl.engine.common.run_dir import RunDir
from agentrl.engine.generation.fleet import GeneratorFleet
from agentrl.engine.loop.evaluation import Evaluator
from agentrl.engine.loop.loop import LoopHook
from agentrl.engine.loop.loop_run import LoopRun
from agentrl.engine.loop.publishing import WeightPublisher, WeightVersions
from agentrl.engine.loop.run_state import RunState
from agentrl.engine.metrics import MetricsLogger
from agentrl.engine.rewards.reward_actors import RewardActors
from agentrl.engine.training.learner_group import LearnerGroup

__all__ = ["Assembly", "GenerationParts", "RolloutWorkers"]


class GenerationParts:
    """The generation side of a run, built together over one :class:`WeightVersions`: the fleet
    that replaces generators from those versions (its ``workers`` is the run's list of rollout
    workers, empty until they start) and the publisher that makes new versions."""

    def __init__(self, fleet: GeneratorFleet, publisher: WeightPublisher) -> None:
        self.fleet = fleet
        self.publisher = publisher


class RolloutWorkers:
    """Starts the run's rollout workers (:meth:`Assembly.rollout_worker`) on the fleet's current
    generators with the reward actors of the moment, and releases what a dead one held outside its
    process. The run's first workers start through it, and so does each replacement
    (:mod:`agentrl.engine.loop.rollout_failover`).

    ``docker``: the workers' sandboxes are Docker containers (removed when their worker dies;
    bubblewrap sandboxes and the agent gateway die with the worker's process)."""

    def __init__(self, assembly: Assembly, fleet: GeneratorFleet, tokenizer: str, rewards: RewardActors, docker: bool) -> None:
        self.assembly, self.fleet, self.tokenizer, self.rewards, self.docker = assembly, fleet, tokenizer, rewards, docker
        self.pids: dict[int, int] = {}
        """The process id of each live worker, by index."""

    async def start(self, index: int) -> Any:
        """Rollout worker ``index``, once it answers."""
        worker = self.assembly.rollout_worker(index, generators=self.fleet.generators, tokenizer=self.tokenizer,
                                              reward_actors=self.rewards.worker_kwargs())
        self.pids[index] = await worker.process_id.remote()
        return worker

    async def teardown(self, index: int) -> None:
        """Release what dead worker ``index`` held outside its process (its Docker containers)."""
        pid = self.pids.pop(index, None)
        if pid is not None and self.docker:
            from agentrl.sandbox.docker import remove_containers_of

            await asyncio.to_thread(remove_containers_of, pid)


class Assembly:
    """Builds the parts of one run from ``recipe`` (the recipe in force: the controller replaces
    it once ``model.dtype`` and ``[placement]`` are resolved) in ``run_dir``.

    ``placement``: the run's :class:`~agentrl.placement_plan.PlacementPlan`, once the controller
    planned it (colocated on GPUs, learner ranks and generators share one reservation)."""

    def __init__(self, recipe: Recipe, run_dir: RunDir) -> None:
        self.recipe = recipe
        self.run_dir = run_dir
        self.placement: Any = None
        self._shared: Any = None

    @classmethod
    def from_recipe(cls, recipe: Recipe) -> Assembly:
        """The assembly of ``recipe`` in its own run directory."""
        return cls(recipe, RunDir(recipe.resolved_run_dir()))

    def close(self) -> None:
        """Release the reservation learner ranks and generators shared (colocated on GPUs)."""
        if self._shared is not None:
            self._shared.close()

    def learner_group(self) -> LearnerGroup:
        """The learner's ranks (not yet started)."""
        from agentrl.engine.training.learner import Learner

        lcfg = self.recipe.learner
        return self._rank_group(Learner, "learner", lcfg.num_ranks, lcfg.num_cpus, lcfg.num_gpus, lcfg.resources,
                                lcfg.cpu_affinity, lcfg.timeout_s, shared=self._shared_placement())

    def critic_group(self) -> LearnerGroup | None:
        """PPO's critic ranks: their own torch.distributed group and placement (None: the recipe
        trains no critic)."""
        from agentrl.engine.training.critic import Critic

        r = self.recipe
        if not (r.algo.advantage == "gae" and r.mode in ("async", "sync")):
            return None
        c = r.critic_settings
        return self._rank_group(Critic, "critic", c.num_ranks, c.num_cpus, c.num_gpus, {}, c.cpu_affinity, c.timeout_s)

    def _rank_group(
        self, cls: type, name: str, num_ranks: int, num_cpus: float, num_gpus: float, resources: dict[str, float],
        cpus: list[int] | None, timeout_s: float, shared: Any = None,
    ) -> LearnerGroup:
        """A group of ``cls`` ranks (``<name>-<rank>`` logs), reserved together as one placement group
        (``shared``: the reservation they share with the generators, colocated on GPUs)."""
        from agentrl.engine.training.placement import LearnerPlacement, learner_bundles

        logs = self.run_dir.logs
        wait_s = self.recipe.learner.placement_timeout_s
        return LearnerGroup(
            num_ranks=num_ranks,
            factory=lambda rank, kwargs, options: new_actor(
                cls, {**options, "runtime_env": wiring.actor_runtime_env(logs, f"{name}-{rank}", cpus)}, **kwargs),
            placement=(lambda: shared) if shared is not None else (
                lambda: LearnerPlacement(learner_bundles(num_ranks, num_cpus, num_gpus, resources), wait_s)),
            timeout_s=timeout_s,
            placement_timeout_s=wait_s,
            name=name,
        )

    def _shared_placement(self) -> Any:
        """Colocated on GPUs: the one reservation that holds learner rank ``i`` and generator ``i``
        on GPU ``i`` (made once per run); None otherwise."""
        from agentrl.engine.training.placement import SharedPlacement

        r = self.recipe
        if self.placement is None or not (self.placement.colocated and self.placement.on_gpu):
            return None
        if self._shared is None:
            lc, g = r.learner, r.generator
            self._shared = SharedPlacement(lc.num_ranks, lc.num_cpus + g.num_cpus, lc.resources, lc.placement_timeout_s).with_learner_cpus(lc.num_cpus)
        return self._shared

    def generation(self, model: str, tokenizer: str, learners: LearnerGroup, log: MetricsLogger) -> GenerationParts:
        """The generators serving ``model`` (tokenizer ``tokenizer``; not yet started), with the
        run's (empty) worker list, and their publisher, over one set of weight versions (written
        by ``learners``)."""
        r = self.recipe
        g = r.generator
        shared = self._shared_placement()

        def factory(settings: Any, version: int, index: int) -> Any:
            spec = wiring.generator_actor(r, settings, version, index, self.run_dir.logs)
            options = {**spec.options, **shared.generator_options(index, g.num_cpus)} if shared is not None else spec.options
            return new_actor(spec.cls, options, *spec.args, **spec.kwargs)

        versions = WeightVersions(learners=learners, run_dir=self.run_dir, log=log, weight_sync=g.weight_sync)
        fleet = GeneratorFleet(
            factory=factory, settings=wiring.engine_settings(r, model=model, tokenizer=tokenizer), count=wiring.generator_count(r),
            log=log, timeout_s=g.timeout_s, startup_timeout_s=g.startup_timeout_s, weights=versions,
        )
        publisher = WeightPublisher(
            fleet=fleet, learners=learners, run_dir=self.run_dir, log=log, weight_sync=g.weight_sync,
            sync_timeout_s=g.weight_sync_timeout_s, workers_per_generator=g.tensor_parallel_size,
            dtype=r.model.dtype, keep_versions=r.learner.keep_versions, versions=versions,
        )
        return GenerationParts(fleet, publisher)

    def rollout_worker(self, index: int, *, generators: list[Any], tokenizer: str, reward_actors: dict[str, Any]) -> Any:
        """Rollout worker ``index`` (a Ray actor, ``rollout-<index>`` logs) on ``generators``,
        with the policy's ``tokenizer`` and the reward actors' handles ``reward_actors``
        (:meth:`~agentrl.engine.rewards.reward_actors.RewardActors.worker_kwargs`)."""
        from agentrl.engine.episodes.rollout import RolloutWorker

        r = self.recipe
        kwargs = wiring.worker_kwargs(r, tokenizer=tokenizer, run_dir=self.run_dir.root)
        options = {"num_cpus": r.rollout.num_cpus, "runtime_env": wiring.actor_runtime_env(self.run_dir.logs, f"rollout-{index}", r.rollout.cpu_affinity)}
        return new_actor(RolloutWorker, options, generators=generators, **kwargs, **reward_actors)

    async def reward_actors(self, workers: Callable[[], list[Any]], log: MetricsLogger) -> tuple[RewardActors, dict[str, Any]]:
        """Start the recipe's separate judge generators and reward model (none: empty); returns
        them and their in-run replaceable slots by scorer name (a replacement is told to the
        rollout workers ``workers()`` gives)."""
        from agentrl.engine.rewards.reward_actors import reward_actor_slots, start_reward_actors

        r = self.recipe
        judges, rm = wiring.judge_actors(r, self.run_dir.logs), wiring.reward_model_actor(r, self.run_dir.logs)
        actors = await start_reward_actors(judges, rm, startup_timeout_s=r.generator.startup_timeout_s, log=log)
        slots = reward_actor_slots(
            actors, judges, rm, workers=workers, log=log, startup_timeout_s=r.generator.startup_timeout_s,
            judge_max_restarts=r.reward.judge.max_restarts if r.reward.judge is not None else 0,
            rm_max_restarts=r.reward.model.max_restarts if r.reward.model is not None else 0,
        )
        return actors, slots

    def rollout_workers(self, fleet: GeneratorFleet, tokenizer: str, rewards: RewardActors) -> RolloutWorkers:
        """What starts (and tears down) the run's rollout workers on ``fleet``."""
        return RolloutWorkers(self, fleet, tokenizer, rewards, docker=self.recipe.sandbox.type == "docker")

    def loop_run(
        self, rows: list[dict[str, Any]], *, generation: GenerationParts, learners: LearnerGroup, critic: LearnerGroup | None,
        evaluator: Evaluator | None, tokenizer: str, log: MetricsLogger, workers: RolloutWorkers,
        reward_slots: dict[str, Any], hooks: Sequence[LoopHook] = (),
    ) -> LoopRun:
        """The RL stage over ``rows``: checkpoints, PPO's critic stage (with ``critic``), learner
        failover (full fine-tuning restarts from the checkpoint's weights, LoRA from the base model
        ``tokenizer``, whose adapter the checkpoint's learner state holds), rollout-worker failover
        through ``workers``, and ``hooks`` (plus the sandbox watch when the recipe has a sandbox)."""
        from agentrl.engine.loop.checkpointing import RunCheckpointer
        from agentrl.engine.loop.critic_stage import CriticStage
        from agentrl.engine.loop.failover import LearnerFailover
        from agentrl.engine.loop.rollout_failover import RolloutFailover
        from agentrl.engine.loop.sandbox_watch import SandboxWatch

        r, rd = self.recipe, self.run_dir
        fleet, publisher = generation.fleet, generation.publisher
        failover = LearnerFailover(
            run_dir=rd, learners=learners, fleet=fleet, publisher=publisher, max_restarts=r.learner.max_restarts, log=log,
            learner_kwargs=lambda weights: wiring.learner_kwargs(r, model=tokenizer if r.lora else weights, tokenizer=tokenizer, run_dir=rd.root),
            critic=critic, critic_kwargs=lambda: wiring.critic_kwargs(r, model=tokenizer),
            start=tokenizer if r.lora is None else None,  # before the first checkpoint: step 0 from the RL starting point
        )
        return LoopRun(
            rows=rows, fleet=fleet, publisher=publisher, learners=learners, log=log, run_dir=rd,
            batch=wiring.batch_settings(r), settings=wiring.loop_settings(r),
            queue_kwargs=wiring.queue_kwargs(r), ledger_kwargs=wiring.ledger_kwargs(r, len(rows)),
            checkpointer=RunCheckpointer(run_dir=rd, learners=learners, keep=r.checkpoint.keep, tokenizer=tokenizer, log=log, critic=critic,
                                         background=r.checkpoint.background),
            failover=failover, evaluator=evaluator,
            hooks=[*hooks, SandboxWatch(log=log)] if r.sandbox.type is not None else list(hooks),
            critic=CriticStage(group=critic, settings=wiring.gae_settings(r), warmup_steps=r.critic_settings.warmup_steps) if critic is not None else None,
            rollout_failover=RolloutFailover(  # one for the stage: its restarts are bounded across learner restarts
                workers=lambda: fleet.workers, start=workers.start, teardown=workers.teardown,
                max_restarts=r.rollout.max_restarts, log=log,
            ),
            reward_actors=reward_slots,
        )

    def evaluator(self, workers: Callable[[], list[Any]], log: MetricsLogger, state: RunState | None) -> Evaluator | None:
        """The held-out evaluation on the rollout workers ``workers()`` gives (None when the recipe
        has none); ``state``: a resumed run's state (its evaluation records go on)."""
        from agentrl.envs.data import load_rows

        r = self.recipe
        e = r.eval
        if not (e.limit or r.mode == "eval"):
            return None
        rows = load_rows(
            e.source or r.data.source, split=e.split, fields=(e.fields if e.fields is not None else r.data.fields) or None,
            limit=e.limit or None, seed=r.seed,
        )
        if e.limit and len(rows) < e.limit:
            log.warning(f"eval.limit = {e.limit} but {e.source or r.data.source} [{e.split}] has only {len(rows)} rows: "
                        f"evaluating on all {len(rows)}")
        sets: dict[str, list[dict[str, Any]]] = {}
        for name, s in e.sets.items():
            fields = s.fields if s.fields is not None else (e.fields if e.fields is not None else r.data.fields)
            limit = s.limit or e.limit or None
            sets[name] = load_rows(s.source, split=s.split, fields=fields or None, limit=limit, seed=r.seed)
            if limit and len(sets[name]) < limit:
                log.warning(f"eval.sets.{name}: {limit} rows asked but {s.source} [{s.split}] has only {len(sets[name])}: "
                            f"evaluating on all {len(sets[name])}")
        return Evaluator(
            workers=workers, rows=rows, temperature=e.temperature, timeout_s=e.timeout_s, log=log,
            samples_path=self.run_dir.eval_samples, records=list(state.evals) if state is not None else [], samples=e.samples,
            sets=sets,
        )

    def metric_sinks(self) -> list[Any]:
        """W&B when ``[wandb] project`` is set."""
        w = self.recipe.wandb
        if w.project is None:
            return []
        from agentrl.engine.metric_sinks import WandbSink

        return [WandbSink(
            project=w.project, entity=w.entity, name=w.name or self.recipe.name, mode=w.mode, tags=w.tags,
            directory=self.run_dir.root, config=self.recipe.model_dump(mode="json"),
        )]
