"""Assembly: the run's parts built from its recipe, so that the controller only orders stages.

:class:`Assembly` reads the recipe (through :mod:`agentrl.engine.wiring`) for every part the
controller uses: the learner and critic rank groups and their placement, the generator fleet with
its weight versions and the run's rollout workers, the publisher, the rollout workers themselves,
the held-out evaluator and the metric sinks. Parts are built when the controller asks, because
some need what an earlier stage made (the model after SFT, the placement once Ray is up); each is
given what it needs in its constructor, none is wired to another afterwards.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentrl.config import Recipe
from agentrl.engine import wiring
from agentrl.engine.common.cluster import new_actor
from agentrl.engine.common.run_dir import RunDir
from agentrl.engine.generation.fleet import GeneratorFleet
from agentrl.engine.loop.evaluation import Evaluator
from agentrl.engine.loop.publishing import WeightPublisher, WeightVersions
from agentrl.engine.loop.run_state import RunState
from agentrl.engine.metrics import MetricsLogger
from agentrl.engine.training.learner_group import LearnerGroup

__all__ = ["Assembly", "GenerationParts"]


class GenerationParts:
    """The generation side of a run, built together over one :class:`WeightVersions`: the fleet
    that replaces generators from those versions (its ``workers`` is the run's list of rollout
    workers, empty until they start) and the publisher that makes new versions."""

    def __init__(self, fleet: GeneratorFleet, publisher: WeightPublisher) -> None:
        self.fleet = fleet
        self.publisher = publisher


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
