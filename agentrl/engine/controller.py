"""Controller: runs one recipe by ordering its stages.

    model → SFT → start the actors → evaluation → RL loop (with learner failover) → final model
    → evaluation → summary

Each stage is another module's job (see docs/architecture.md for the map): the parts are built
from the recipe by :mod:`~agentrl.engine.assembly` (the controller receives them built), the
recipe becomes plain arguments in :mod:`~agentrl.engine.wiring`, actors are Ray's through
:mod:`~agentrl.engine.common.cluster`, generators live in the :mod:`~agentrl.engine.generation.fleet`, versions
reach them through the :mod:`~agentrl.engine.loop.publishing` publisher, the RL loop is
:mod:`~agentrl.engine.loop.loop` over the :mod:`~agentrl.engine.loop.ledger` and the staleness queue.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentrl.config import Recipe
from agentrl.engine import wiring
from agentrl.engine.assembly import Assembly, GenerationParts, RolloutWorkers
from agentrl.engine.common.cluster import RayErrorRoute, cluster_nodes, shutdown_all, start_ray, stop_ray
from agentrl.engine.loop.evaluation import Evaluator
from agentrl.engine.generation.fleet import GeneratorFleet
from agentrl.engine.training.learner_group import LearnerGroup
from agentrl.engine.loop.loop import LoopHook, RLLoop
from agentrl.engine.metrics import MetricsLogger
from agentrl.engine.prepare import prepare_model
from agentrl.engine.rewards.reward_actors import RewardActors
from agentrl.engine.common.run_dir import RunDir
from agentrl.engine.loop.run_state import (
    RunState,
    link_tree,
    read_state,
    truncate_logs,
)
from agentrl.engine.common.summary import RunSummary, write_summary
from agentrl.engine.common.waits import timed
from agentrl.errors import ConfigError

__all__ = ["Controller", "RunSummary"]


class Controller:
    """Runs one recipe to completion: ``Controller(recipe).run()``.

    ``hooks``: objects called at fixed points of the RL loop (see
    :class:`~agentrl.engine.loop.loop.LoopHook`; fault injection in tests). ``fresh``: start
    over, an earlier run in the run directory renamed aside; ``resume_from``: a checkpoint folder
    (or run directory) to go on from (:mod:`agentrl.engine.run_start`)."""

    def __init__(
        self, recipe: Recipe, *, hooks: Sequence[LoopHook] = (), fresh: bool = False, resume_from: str | Path | None = None,
        assembly: Assembly | None = None,
    ) -> None:
        """``assembly``: what builds the run's parts (None: :meth:`Assembly.from_recipe` of ``recipe``)."""
        self.parts = assembly if assembly is not None else Assembly.from_recipe(recipe)
        self.fresh = fresh
        self.resume_from = resume_from
        self.hooks = list(hooks)
        self.rewards = RewardActors()
        """A separate judge's generators and the reward model (``[reward]``), once started."""
        self.reward_slots: dict[str, Any] = {}
        """The same, replaceable in-run (:func:`~agentrl.engine.rewards.reward_actors.reward_actor_slots`), by scorer name."""
        self.workers: RolloutWorkers | None = None
        """What starts and tears down the rollout workers, once the actors start."""

    @property
    def recipe(self) -> Recipe:
        """The recipe in force (``model.dtype`` and ``[placement]`` resolved once known)."""
        return self.parts.recipe

    @recipe.setter
    def recipe(self, recipe: Recipe) -> None:
        self.parts.recipe = recipe

    @property
    def run_dir(self) -> RunDir:
        """The run directory (the recipe's ``run_dir``, default ``runs/<name>``)."""
        return self.parts.run_dir

    @property
    def placement(self) -> Any:
        """The run's :class:`~agentrl.placement_plan.PlacementPlan`, once Ray is up."""
        return self.parts.placement

    def run(self) -> RunSummary:
        """Run the recipe to the end and return its summary."""
        return asyncio.run(self._run())

    # ------------------------------------------------------------------ the stages
    async def _run(self) -> RunSummary:
        from agentrl.envs.data import load_rows

        from agentrl.engine.run_start import plan_start

        r, rd = self.recipe, self.run_dir
        training = r.mode in ("async", "sync")
        if not training and (self.fresh or self.resume_from is not None):
            raise ConfigError(f"--fresh and --resume-from are for training runs (mode async or sync); this recipe's mode is {r.mode!r}")
        if training:  # the user's reward functions load here first: a bad one is refused before anything starts
            from agentrl.engine.rewards.functions import RewardFunction

            for spec in wiring.reward_function_specs(r):
                RewardFunction(spec)
        start = plan_start(rd, fresh=self.fresh, resume_from=self.resume_from, resume=r.checkpoint.resume, model_path=r.model.path) if training else None
        rd.root.mkdir(parents=True, exist_ok=True)
        rd.recipe.write_text(json.dumps(r.model_dump(mode="json"), indent=2))
        log = MetricsLogger(rd.root, max_steps=r.learner.max_steps, sinks=self.parts.metric_sinks())
        if start is not None and start.message:
            log.event(start.message)
        log.where_to_look()  # the commands that show the run: TensorBoard's and agentrl report's
        rows = load_rows(r.data.source, split=r.data.split, fields=r.data.fields or None, limit=r.data.limit, seed=r.seed)
        r = self._choose_dtype(log)
        model = prepare_model(r, rows, log)
        started_ray = start_ray(wiring.ray_init_kwargs(r))
        r = self._place(log)
        learners = self.parts.learner_group()
        critic = self.parts.critic_group()
        fleet: GeneratorFleet | None = None
        ray_errors = RayErrorRoute(self._ray_error_sink())  # Ray's '(raylet) A worker died...' paragraphs: to the logs
        try:
            log.event(f"run {r.name}: mode={r.mode} max_staleness={r.max_staleness} rows={len(rows)} model={model}")
            if r.sft.steps:
                model = await self._sft(learners, model, log)
            if r.mode == "sft":
                return self._summarise(RunSummary(rd.root, r.sft.steps, 0, Path(model), 0, 0, 0), [])
            tokenizer = model  # the RL starting point: tokenizer and KL reference, also on a resume
            ckpt = start.checkpoint if start is not None else None
            state = self._resume_from(ckpt, log) if ckpt is not None else None
            adapters = r.lora is not None  # versions are adapters over the starting model
            if ckpt is not None and not adapters:
                model = str(ckpt / "weights")
            generation = self.parts.generation(model, tokenizer, learners, log)
            fleet, publisher = generation.fleet, generation.publisher
            version = state.version if state is not None else 0
            await self._start_actors(fleet, learners if r.mode != "eval" else None, model, tokenizer, 0 if adapters else version, log, critic)
            if ckpt is not None:
                await learners.call("load_checkpoint", str(ckpt / "learner"), what="loading the learner checkpoint")
                if critic is not None and (ckpt / "critic").is_dir():
                    await critic.call("load_checkpoint", str(ckpt / "critic"), what="loading the critic checkpoint")
                if adapters:
                    await fleet.load(version, rd.weights_version(version))
            await publisher.connect()
            evaluator = self.parts.evaluator(lambda: fleet.workers, log, state)
            if evaluator is not None and state is None:
                await evaluator(0)
            if r.mode == "eval":
                return self._summarise(RunSummary(rd.root, 0, 0, Path(model), 0, 0, 0), evaluator.records if evaluator else [])
            loop = await self._rl(rows, generation, learners, evaluator, tokenizer, state, log, critic)
            final = rd.final
            await learners.call("publish", str(final), with_tokenizer=True, serving_dtype=True, merged=True, what="writing the final checkpoint")
            if r.lora is not None:
                await learners.call("publish", str(rd.final_adapter), serving_dtype=True, what="writing the final adapter")
            log.event(f"final checkpoint: {final}" + (f" (adapter: {rd.final_adapter})" if r.lora is not None else ""), version=loop.version)
            summary = loop.ledger.summary(rd.root, loop.version, final, loop.queue)
            summary.ended_early = loop.ended_early  # a mastered task: a success, said in words
            if evaluator is not None and r.eval.limit:
                await evaluator(loop.version)
            return self._summarise(summary, evaluator.records if evaluator else [])
        finally:
            try:
                if fleet is not None:
                    fleet.cancel_reload()
                    await shutdown_all([*fleet.workers, *fleet.generators, *self.rewards.handles])
                await learners.stop()
                if critic is not None:
                    await critic.stop()
                self.parts.close()
                log.close()
            finally:  # a failing stop above must not leave Ray's printer routed to this run's log
                ray_errors.remove()
                if started_ray:
                    stop_ray()

    def _ray_error_sink(self) -> Any:
        """Where Ray's own error messages go during the run: ``logs/ray_errors.log`` of the run
        directory (agentrl says what happened in words on the console; Ray's paragraph is kept)."""
        path = self.run_dir.logs / "ray_errors.log"

        def sink(line: str) -> None:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a") as f:
                f.write(line.rstrip("\n") + "\n")

        return sink

    def _choose_dtype(self, log: MetricsLogger) -> Recipe:
        """Resolve ``model.dtype`` (``auto``: :mod:`agentrl.dtype_plan`) before the model is
        imported or loaded: the recipe in force from here on, its dtype said in the run's first
        lines."""
        from agentrl.dtype_plan import plan_dtype

        r = self.recipe
        plan = plan_dtype(r.model.dtype, gpu=r.generator.num_gpus > 0 or r.learner.num_gpus > 0,
                          explicit="dtype" in r.model.model_fields_set)
        if plan.dtype != r.model.dtype:
            self.recipe = r = r.model_copy(update={"model": r.model.model_copy(update={"dtype": plan.dtype})})
            self.run_dir.recipe.write_text(json.dumps(r.model_dump(mode="json"), indent=2))
        log.event(plan.line(), dtype=plan.dtype, dtype_requested=plan.requested)
        return r

    def _place(self, log: MetricsLogger) -> Recipe:
        """Resolve ``[placement]`` on the cluster Ray reports (:mod:`agentrl.placement_plan`): the
        recipe in force from here on, its plan said in the run's first lines."""
        from agentrl.placement_plan import ClusterShape, apply_placement, plan_placement

        r = self.recipe
        local = ClusterShape.this_machine(gpu_memory_gib=r.placement.gpu_memory_gib)
        shape = ClusterShape.from_ray_nodes(cluster_nodes(), gpu_memory_gib=local.gpu_memory_gib)
        if shape.nodes == 1 and r.ray.address is None:  # our own local cluster: its real cores, not Ray's logical CPUs
            shape = ClusterShape(local.cpus, shape.gpus, local.gpu_memory_gib)
        self.parts.placement = plan = plan_placement(r, shape)
        self.recipe = r = apply_placement(r, plan)
        self.run_dir.recipe.write_text(json.dumps(r.model_dump(mode="json"), indent=2))
        first, *rest = plan.lines()
        log.event(first, placement=plan.mode, placement_reason=plan.reason, max_staleness=plan.max_staleness)
        for line in rest:
            log.event(line.strip())
        return r

    async def _sft(self, learners: LearnerGroup, model: str, log: MetricsLogger) -> str:
        """The supervised warm-up; the folder of the warmed-up model."""
        from agentrl.engine.loop.sft_stage import run_sft

        r = self.recipe
        c = r.sft
        return await run_sft(
            learners, wiring.learner_kwargs(r, model=model, tokenizer=None, run_dir=self.run_dir.root, stage="sft"),
            model=model, out=self.run_dir.sft, source=c.source, num_examples=c.num_examples, steps=c.steps,
            batch_size=c.batch_size, seed=r.seed, log=log, max_restarts=r.learner.max_restarts,
        )

    def _resume_from(self, ckpt: Path, log: MetricsLogger) -> RunState:
        """The run state of checkpoint ``ckpt``; the logs are cut back to it and its weights are
        published again as its version (replacement generators start from them)."""
        state = read_state(ckpt)
        truncate_logs(self.run_dir.root, state.version)
        folder = self.run_dir.weights_version(state.version)
        if not folder.exists():
            link_tree(ckpt / "weights", folder)
        log.event(f"resuming from {ckpt} (step {state.version}, {len(state.reissue)} prompts re-issued)", step=state.version)
        return state

    async def _start_actors(
        self, fleet: GeneratorFleet, learners: LearnerGroup | None, model: str, tokenizer: str, version: int, log: MetricsLogger,
        critic: LearnerGroup | None = None,
    ) -> None:
        """Start the generators (serving ``model`` as ``version``), (unless None) the learner
        ranks and the critic's together, then the rollout workers; a worker that cannot start (bad env,
        tokenizer, sandbox) is a clear error now, not a stream of lost groups later."""
        r = self.recipe
        learner_kwargs = wiring.learner_kwargs(r, model=model, tokenizer=tokenizer, run_dir=self.run_dir.root)
        from agentrl.engine.ready_lines import clocked, critic_line, generators_line, learner_line

        for group in (learners, critic):  # the ranks' node(s) first: the generators may not take them
            if group is not None:
                await group.reserve()
        gen_info, (learner_info, learner_s), (critic_info, critic_s) = await asyncio.gather(
            fleet.start(version), clocked(learners.start(learner_kwargs) if learners is not None else asyncio.sleep(0, [])),
            # the critic starts from the RL starting point; a resume then loads its checkpoint
            clocked(critic.start(wiring.critic_kwargs(r, model=tokenizer), what="critic set-up") if critic is not None else asyncio.sleep(0, [])),
        )
        log.event(generators_line(gen_info), generators=gen_info)  # one line in words; the infos in metrics.jsonl
        if learners is not None:
            log.event(learner_line(learner_info, learner_s), learners=learner_info)
        if critic is not None:
            log.event(critic_line(critic_info, critic_s), critics=critic_info)
        self.rewards, self.reward_slots = await self.parts.reward_actors(lambda: fleet.workers, log)  # replaced in-run when they die
        self.workers = workers = self.parts.rollout_workers(fleet, tokenizer, self.rewards)
        started = await timed(asyncio.gather(*[workers.start(i) for i in range(r.rollout.num_workers)]), 300, "rollout worker start-up")
        fleet.add_workers(started)

    async def _rl(
        self, rows: list[dict[str, Any]], generation: GenerationParts, learners: LearnerGroup,
        evaluator: Evaluator | None, tokenizer: str, state: RunState | None, log: MetricsLogger,
        critic: LearnerGroup | None = None,
    ) -> RLLoop:
        """The RL loop from ``state`` (None: the start); a learner rank that dies is restarted
        from the newest checkpoint (``learner.max_restarts`` times) and the loop goes on from it."""
        assert self.workers is not None, "the actors start before the RL stage"
        stage = self.parts.loop_run(rows, generation=generation, learners=learners, critic=critic, evaluator=evaluator,
                                    tokenizer=tokenizer, log=log, workers=self.workers, reward_slots=self.reward_slots, hooks=self.hooks)
        return await stage.run(state)

    def _summarise(self, summary: RunSummary, evals: list[dict[str, Any]]) -> RunSummary:
        write_summary(self.run_dir.summary, summary, evals)
        return summary
