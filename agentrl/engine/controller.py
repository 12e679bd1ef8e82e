"""Controller: the Ray driver that wires a run together and turns the loop.

It owns the run directory, starts the actors (generators, rollout workers, learner ranks),
admits groups of episodes under the staleness bound, hands full batches to the learner while
rollouts go on, publishes each new weight version to the generators in flight, logs metrics and
writes the final Hugging Face checkpoint. It reads the recipe; the components it builds receive
plain arguments.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from collections import Counter, deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from agentrl.config import Recipe
from agentrl.engine.audit import episodes_audit_path, learner_audit_path
from agentrl.engine.metrics import MetricsLogger
from agentrl.engine.placement import LearnerPlacement, learner_bundles
from agentrl.engine.run_state import (
    RunState,
    latest_checkpoint,
    link_tree,
    prune_checkpoints,
    read_state,
    truncate_logs,
    write_checkpoint_state,
)
from agentrl.engine.staleness import StalenessQueue
from agentrl.engine.trajectory import Trajectory
from agentrl.engine.waits import timed
from agentrl.errors import AgentRLError, GeneratorError, InfraError, LearnerError, TimeoutError_, WeightSyncError

__all__ = ["Controller", "RunSummary", "prepare_model"]

_MAX_PROMPT_ATTEMPTS = 3
"""Times a prompt whose whole group failed on infrastructure is tried before it is abandoned."""


@dataclass
class RunSummary:
    """What a finished run produced."""

    run_dir: Path
    steps: int
    version: int
    final_checkpoint: Path
    samples_trained: int
    dropped_stale: int
    infra_failures: int
    prompt_cursor: int = 0
    """Prompt indices ``0 .. prompt_cursor - 1`` were issued."""
    untrained_prompts: list[int] = field(default_factory=list)
    """Issued prompts not trained when the run ended (queued, in flight or waiting for a retry)."""
    dropped_prompts: list[int] = field(default_factory=list)
    """Prompts whose groups were dropped as over-stale."""
    abandoned_prompts: list[int] = field(default_factory=list)
    """Prompts given up after their whole group failed on infrastructure ``_MAX_PROMPT_ATTEMPTS``
    times (counted since the process started)."""


def prepare_model(recipe: Recipe, rows: list[dict[str, Any]], log: MetricsLogger | None = None) -> str:
    """Return the model to load; first build a tiny one (``[model] build``) or import a GGUF one
    (``[model] import``) there when the recipe asks and ``model.path`` is missing or empty."""
    path = Path(recipe.model.path).absolute()  # actors on other nodes do not share our working directory
    if (recipe.model.build is None and recipe.model.import_ is None) or (path.exists() and any(path.iterdir())):
        return str(path) if path.is_dir() else recipe.model.path  # else a hub id
    if recipe.model.import_ is not None:
        from agentrl.models.importing import import_model

        if log:
            log.event(f"importing {recipe.model.import_} to {path} ({recipe.model.dtype})")
        import_model(recipe.model.import_, path, dtype=recipe.model.dtype, overwrite=True)
        return str(path)
    from agentrl.envs.corpus import tokenizer_corpus
    from agentrl.models.tiny import TinyModelSpec, build_tiny_model

    spec = TinyModelSpec(**recipe.model.tiny.model_dump())
    texts = tokenizer_corpus(recipe.env.id, rows, seed=recipe.model.tiny.seed)
    if log:
        log.event(f"building tiny model at {path} ({len(texts)} tokenizer texts)")
    build_tiny_model(path, texts, spec)
    return str(path)


@dataclass
class Reload:
    """A weight version being loaded into the generators in the background."""

    version: int
    task: asyncio.Future
    """Resolves to the generation stalls (seconds), or raises what the load raised."""


class Controller:
    """Runs one recipe to completion: ``Controller(recipe).run()``."""

    def __init__(self, recipe: Recipe) -> None:
        self.recipe = recipe
        self.run_dir = recipe.resolved_run_dir()
        self.tokenizer_source: str | None = None
        """The folder or hub id the tokenizer is read from (weights folders may not hold one)."""
        self.published_version = 0
        """Newest weight version the generators were given (restarted generators load the newest
        one written to disk)."""
        self.transfer_active = False
        """Versions go to the generators over the weight-transfer group (else through disk)."""
        self._heal_lock = asyncio.Lock()
        self._learner_placement: LearnerPlacement | None = None
        self.reload: Reload | None = None
        """The weight version the generators are loading from disk while the learner trains on."""

    # ------------------------------------------------------------------ set-up
    def _start_ray(self) -> bool:
        import ray

        r = self.recipe
        if ray.is_initialized():
            return False
        if r.ray.address:
            ray.init(address=r.ray.address, logging_level="warning", log_to_driver=True)
        else:
            need = (
                r.generator.num_generators * r.generator.num_cpus
                + r.rollout.num_workers * r.rollout.num_cpus
                + r.learner.num_ranks * r.learner.num_cpus
            )
            ray.init(
                num_cpus=r.ray.num_cpus or max(2, int(need + 0.999)),
                include_dashboard=False,
                logging_level="warning",
                log_to_driver=True,
            )
        return True

    def _learner_actors(
        self, model: str, *, env_vars: dict[str, str], lr: float | None = None, torch_threads: int | None = None,
        warmup_steps: int | None = None, total_steps: int | None = None, for_rl: bool | None = None,
        lr_schedule: str | None = None,
    ) -> list[Any]:
        """Create (not set up) the learner ranks as Ray actors; ``lr``/``torch_threads``/``warmup_steps``
        override the recipe's learner values (the SFT stage uses its own).

        ``for_rl`` (default: ``lr`` is not overridden) says whether the ranks train the RL
        objective: only then do they get ``learner.lr_schedule`` over ``total_steps`` (default
        ``max_steps * algo.updates_per_batch``) and load a reference model for a KL term. Other
        stages get a constant LR after warm-up unless they pass ``total_steps``."""
        import ray

        from agentrl.algos import ObjectiveSettings
        from agentrl.engine.learner import Learner

        r = self.recipe
        lcfg, a = r.learner, r.algo
        rl = lr is None if for_rl is None else for_rl
        objective = ObjectiveSettings(
            policy_loss=a.policy_loss, clip_low=a.clip_low, clip_high=a.clip_high, dual_clip=a.dual_clip,
            off_policy=a.off_policy, is_cap=a.is_cap, ratio_band=tuple(a.ratio_band) if a.ratio_band else None,
            loss_agg=a.loss_agg, kl_coef=a.kl_coef if rl else 0.0, kl_estimator=a.kl_estimator,
        )
        if total_steps is None and rl:
            total_steps = lcfg.max_steps * a.updates_per_batch
        schedule = (lr_schedule or lcfg.lr_schedule) if total_steps is not None else "constant"
        self._release_learner_placement()
        self._learner_placement = LearnerPlacement(
            learner_bundles(lcfg.num_ranks, lcfg.num_cpus, lcfg.num_gpus, lcfg.resources), r.learner.placement_timeout_s
        )
        address, port = self._learner_placement.rendezvous(r.learner.placement_timeout_s)
        learner_cls = ray.remote(Learner)
        return [
            learner_cls.options(**self._learner_placement.options(rank), runtime_env={"env_vars": env_vars}).remote(
                rank=rank,
                world_size=lcfg.num_ranks,
                master_addr=address,
                master_port=port,
                model=model,
                dtype=r.model.dtype,
                lr=lr if lr is not None else lcfg.lr,
                betas=lcfg.betas,
                weight_decay=lcfg.weight_decay,
                adam_eps=lcfg.adam_eps,
                grad_clip=lcfg.grad_clip,
                warmup_steps=warmup_steps if warmup_steps is not None else lcfg.warmup_steps,
                lr_schedule=schedule,
                total_steps=total_steps,
                min_lr_ratio=lcfg.min_lr_ratio,
                micro_batch_tokens=lcfg.micro_batch_tokens,
                logprob_chunk_tokens=lcfg.logprob_chunk_tokens,
                activation_checkpointing=lcfg.activation_checkpointing,
                compute_entropy=lcfg.compute_entropy,
                objective=objective,
                updates_per_batch=a.updates_per_batch if rl else 1,
                proximal=a.proximal,
                # on a resume ``model`` is a checkpoint: the KL anchor and the tokenizer stay
                # the RL starting point
                reference_model=lcfg.reference_model or self.tokenizer_source or model,
                tokenizer=self.tokenizer_source or model,
                torch_threads=torch_threads if torch_threads is not None else lcfg.torch_threads,
                timeout_s=lcfg.timeout_s,
                seed=r.seed,
                audit_path=str(learner_audit_path(self.run_dir)),
                temperature=r.rollout.temperature if rl else 1.0,
            )
            for rank in range(lcfg.num_ranks)
        ]

    def _new_generator(self, settings: Any, version: int, index: int) -> Any:
        """A (not yet started) generator actor number ``index`` with the recipe's placement:
        a vLLM engine, or with ``backend = "http"`` a client of ``urls[index]`` that loads
        ``settings.model`` into the server when it is a local folder (an SFT stage, a resumed
        checkpoint, a replacement mid-run); a hub id is taken to be what the server serves."""
        import ray

        from agentrl.engine.generator import Generator

        g = self.recipe.generator
        if g.backend == "http":
            from agentrl.engine.http_generator import HttpGenerator

            load = str(Path(settings.model).resolve()) if Path(settings.model).is_dir() else None
            return ray.remote(HttpGenerator).options(num_cpus=0.1, runtime_env={"env_vars": self._env_vars}).remote(
                g.urls[index], timeout_s=g.timeout_s, version=version, load=load
            )
        return ray.remote(Generator).options(
            num_cpus=g.num_cpus, num_gpus=g.num_gpus, resources=dict(g.resources) or None,
            runtime_env={"env_vars": self._env_vars},
        ).remote(settings, timeout_s=g.timeout_s, version=version)

    async def _heal_generators(self, version: int, log: MetricsLogger, force: tuple[Any, ...] = ()) -> int:
        """Replace every generator that does not answer a health check with a new one serving the
        current weights (version ``version``); hand the new set to the rollout workers. Returns
        how many were replaced. Episodes that were on a dead generator are already marked
        ``infra_failure`` by the workers and stay out of the loss. ``force`` holds generator handles
        to replace even if they answer (they failed to load the current weights)."""
        async with self._heal_lock:  # one repair at a time; a second caller sees the repaired set
            return await self._heal_locked(version, log, force)

    async def _heal_locked(self, version: int, log: MetricsLogger, force: tuple[Any, ...]) -> int:
        import ray

        g = self.recipe.generator
        version = max(version, self.published_version)  # restart on the newest weights
        replaced = 0
        for i, gen in enumerate(list(self.generators)):
            if any(gen is f for f in force):
                reason = "it failed to load the current weights"
            else:
                try:
                    await asyncio.wait_for(gen.stats.remote(), 30)
                    continue
                except Exception as exc:  # dead actor, crashed engine, no answer
                    reason = f"{type(exc).__name__}: {str(exc)[:200]}"
            ray.kill(gen, no_restart=True)
            if self.transfer_active:  # the transfer group lost a member
                self.transfer_active = False
                log.event(f"weight sync over {g.weight_sync} ended (generator {i} replaced); versions go through disk from now on", weight_sync_fallbacks=1)
            on_disk, weights = self._newest_on_disk(version)
            if on_disk < version and self.learners and g.weight_sync != "disk":
                # versions were broadcast, not written: write the learner's current one now
                written = await timed(
                    asyncio.gather(*[lr.publish_version.remote(str(self.run_dir / "weights")) for lr in self.learners]),
                    self.recipe.learner.timeout_s, "publishing the current version for a replaced generator", LearnerError,
                )
                on_disk, weights = written[0], self.run_dir / "weights" / f"v{written[0]:06d}"
            settings = replace(self._engine_settings, model=str(weights) if weights is not None else self._engine_settings.model)
            new = self._new_generator(settings, on_disk, i)
            await timed(new.start.remote(), g.startup_timeout_s, f"restarting generator {i}", GeneratorError)
            self.generators[i] = new
            replaced += 1
            log.event(f"generator {i} restarted at version {on_disk} ({reason})", generator_restarts=1)
        if replaced:
            await asyncio.gather(*[w.set_generators.remote(self.generators) for w in self.workers])
        return replaced

    def _newest_on_disk(self, version: int) -> tuple[int, Path | None]:
        """The newest published weight folder at or below ``version`` (``(0, None)``: none, start
        from the initial model). With a collective weight sync, versions are not written."""
        folder = self.run_dir / "weights"
        written = [int(p.name[1:]) for p in folder.glob("v[0-9]*") if p.is_dir() and p.name[1:].isdigit()] if folder.is_dir() else []
        newest = max((v for v in written if 0 < v <= version), default=0)
        return (newest, folder / f"v{newest:06d}") if newest else (0, None)

    async def _catch_up_replacements(self, updated: list[Any], version: int) -> None:
        """Load ``version`` into generators that a concurrent repair started (on older weights)
        while ``updated`` were taking it; one that cannot load it is replaced again."""
        async with self._heal_lock:  # waits for a repair in progress
            fresh = [g for g in self.generators if not any(g is u for u in updated)]
        if not fresh:
            return
        path = str(self.run_dir / "weights" / f"v{version:06d}")
        if not Path(path).exists():  # broadcast, not written: write it now for the newcomers
            await timed(asyncio.gather(*[lr.publish.remote(path, serving_dtype=True) for lr in self.learners]), self.recipe.learner.timeout_s, f"publishing version {version}", LearnerError)
        outcomes = await timed(
            asyncio.gather(*[g.update_weights.remote(version, path) for g in fresh], return_exceptions=True),
            self.recipe.generator.timeout_s + 30,
            f"loading version {version} into replaced generators",
            GeneratorError,
        )
        broken = tuple(g for g, o in zip(fresh, outcomes) if isinstance(o, BaseException))
        if broken:
            await self._heal_generators(version, self.log, force=broken)

    async def _start_actors(self, model: str, log: MetricsLogger, *, with_learners: bool = True, version: int = 0) -> None:
        """Start generators, learner ranks (unless ``with_learners`` is False) and rollout workers."""
        import ray

        from agentrl.engine.generator import EngineSettings
        from agentrl.engine.rollout import RolloutWorker

        r = self.recipe
        g = r.generator
        env_vars = {"VLLM_LOGGING_LEVEL": "WARNING", "TOKENIZERS_PARALLELISM": "false", "TQDM_DISABLE": "1"}
        settings = EngineSettings(
            model=model,
            tokenizer=self.tokenizer_source or model,
            dtype=r.model.dtype,
            max_model_len=g.max_model_len,
            kv_cache_gib=g.kv_cache_gib,
            gpu_memory_utilization=g.gpu_memory_utilization,
            enforce_eager=g.enforce_eager,
            enable_prefix_caching=g.enable_prefix_caching,
            block_size=g.block_size,
            cpu_threads_bind=g.cpu_threads_bind,
            seed=r.seed,
            weight_transfer=None if g.weight_sync == "disk" else g.weight_sync,
            recompute_kv_on_update=g.recompute_kv_on_update,
            # tensor parallelism inside the actor: vLLM's workers are processes that see the
            # actor's GPUs (the Ray executor would ask Ray for GPUs the actor already holds)
            extra={
                **({"tensor_parallel_size": g.tensor_parallel_size, "distributed_executor_backend": "mp"} if g.tensor_parallel_size > 1 else {}),
                **{k: v for k, v in (("max_num_seqs", g.max_num_seqs), ("max_num_batched_tokens", g.max_num_batched_tokens)) if v is not None},
            },
        )
        self._engine_settings, self._env_vars = settings, env_vars
        count = len(g.urls) if g.backend == "http" else g.num_generators
        self.generators = [self._new_generator(settings, version, i) for i in range(count)]
        lcfg = r.learner
        self.learners = self._learner_actors(model, env_vars=env_vars) if with_learners else []
        gen_info, learner_info = await asyncio.gather(
            timed(asyncio.gather(*[a.start.remote() for a in self.generators]), g.startup_timeout_s, "generator start-up", GeneratorError),
            timed(asyncio.gather(*[a.setup.remote() for a in self.learners]), lcfg.timeout_s, "learner set-up", LearnerError),
        )
        log.event(f"generators ready: {gen_info}", generators=gen_info)
        if with_learners:
            log.event(f"learner ready: {learner_info}", learners=learner_info)
        ro = r.rollout
        sampling = {"temperature": ro.temperature, "top_p": ro.top_p, "stop": list(ro.stop)}
        worker_cls = ray.remote(RolloutWorker)
        self.workers = [
            worker_cls.options(num_cpus=ro.num_cpus, runtime_env={"env_vars": env_vars}).remote(
                model=self.tokenizer_source or model,
                env_id=r.env.id,
                env_kwargs=r.env.kwargs,
                sandbox_kind=r.sandbox.type,
                sandbox_kwargs={
                    "max_concurrency": r.sandbox.max_concurrency,
                    "timeout_s": r.sandbox.timeout_s,
                    "memory_mb": r.sandbox.memory_mb,
                    **({"preload": r.sandbox.preload} if r.sandbox.preload is not None else {}),
                },
                generators=self.generators,
                sampling=sampling,
                max_new_tokens=ro.max_new_tokens,
                max_episode_tokens=min(ro.max_episode_tokens, g.max_model_len),
                max_concurrent_episodes=ro.max_concurrent_episodes,
                generate_timeout_s=g.timeout_s,
                seed=r.seed,
                audit_path=str(episodes_audit_path(self.run_dir)),
                seed_sampling=ro.seed_sampling,
            )
            for _ in range(ro.num_workers)
        ]
        # a worker that cannot start (bad env, tokenizer, sandbox) is a clear error now, not a
        # stream of lost groups later
        await timed(asyncio.gather(*[w.ping.remote() for w in self.workers]), 300, "rollout worker start-up")

    # ------------------------------------------------------------------ one step
    def _batch_samples(self, batch: list[list[Trajectory]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Training samples of a batch of groups: trainable episodes only, rewards with the
        overlong penalty (when set), zero-variance groups dropped (when set), advantages by
        ``algo.advantage`` over the groups that remain."""
        import torch

        from agentrl.algos import compute_advantages, nonzero_variance_mask, overlong_penalty

        a = self.recipe.algo
        kept = [t for g in batch for t in g if t.trainable]
        group = torch.tensor([gi for gi, g in enumerate(batch) for t in g if t.trainable], dtype=torch.long)
        rewards = torch.tensor([float(t.reward) for t in kept], dtype=torch.float64)
        penalty = torch.zeros_like(rewards)
        if a.overlong_max_tokens is not None and kept:
            lengths = torch.tensor([t.num_generated for t in kept])
            penalty = overlong_penalty(lengths, a.overlong_max_tokens, a.overlong_buffer_tokens)
        rewards = rewards + penalty
        keep = nonzero_variance_mask(rewards, group) if a.filter_zero_variance_groups and kept else torch.ones(len(kept), dtype=torch.bool)
        dropped_groups = len(set(group[~keep].tolist()))
        idx = keep.nonzero().flatten().tolist()
        advs = compute_advantages(rewards[idx], group[idx], a.advantage).tolist() if idx else []
        samples = [
            {
                "tokens": kept[i].tokens,
                "loss_mask": kept[i].loss_mask,
                "behaviour_logprobs": kept[i].behaviour_logprobs,
                "advantage": adv,
                "versions": kept[i].versions,
                "id": kept[i].sample_id,
            }
            for i, adv in zip(idx, advs)
        ]
        algo_stats = {
            "zero_variance_groups_dropped": dropped_groups,
            "overlong_penalty_mean": float(penalty.mean()) if kept else 0.0,
            "advantage_abs_mean": sum(abs(x) for x in advs) / max(1, len(advs)),
        }
        flat = [t for g in batch for t in g]
        ok = [t for t in flat if t.trainable]
        stats = {
            "reward_mean": sum(t.reward for t in ok) / max(1, len(ok)),
            "samples": len(flat),
            "infra_failures_batch": len(flat) - len(ok),
            "status": dict(Counter(t.status for t in flat)),
            "turns_mean": sum(t.metrics.get("turns", 0) for t in flat) / max(1, len(flat)),
            "tool_calls_mean": sum(t.metrics.get("tool_calls", 0) for t in flat) / max(1, len(flat)),
            "tool_errors_mean": sum(t.metrics.get("tool_errors", 0) for t in flat) / max(1, len(flat)),
            "generated_tokens_mean": sum(t.num_generated for t in flat) / max(1, len(flat)),
            "max_token_version": max((t.newest_version or 0) for t in flat) if flat else 0,
            **algo_stats,
        }
        return samples, stats

    async def _train(self, batch: list[list[Trajectory]], version: int) -> dict[str, Any]:
        """Train on ``batch`` with the learner at ``version``; publish ``version + 1`` (see
        :meth:`_sync_weights`: over disk, the generators are still loading it when this returns)."""
        r = self.recipe
        flat = [t for g in batch for t in g]
        hist = Counter(str(version - (t.oldest_version if t.oldest_version is not None else version)) for t in flat)
        samples, stats = self._batch_samples(batch)
        t0 = time.monotonic()
        results = await timed(
            asyncio.gather(*[lr.train_step.remote(samples) for lr in self.learners]),
            r.learner.timeout_s,
            f"learner step {version + 1}",
            LearnerError,
        )
        train_s = time.monotonic() - t0
        new_version = version + 1
        stalls, learner_busy_s = await self._sync_weights(new_version, t0)
        await asyncio.to_thread(self._prune_versions, new_version)
        m = results[0]
        examples = [
            {"group_id": t.group_id, "reward": t.reward, "status": t.status, "text": t.info.get("text", "")}
            for t in batch[0][:2]
        ]
        return {
            "_examples": examples,
            **stats,
            **{k: v for k, v in m.items() if k != "step"},
            "staleness_hist": dict(hist),
            "train_tokens_per_s": m["trained_tokens"] / max(1e-9, train_s),
            "publish_s": time.monotonic() - t0 - train_s,
            "update_stall_s": max(stalls) if stalls else 0.0,
            "learner_busy_s": learner_busy_s,
            "version": new_version,
        }

    async def _sync_weights(self, new_version: int, t0: float) -> tuple[list[float], float]:
        """Bring the generators to ``new_version``: broadcast over the transfer group when one is
        active (done when this returns), else (or when the broadcast fails) write the version to
        disk and start loading it in flight (:attr:`reload`; the learner goes on meanwhile).
        First waits for the previous load. Returns the generation stalls of the update that
        completed here (the broadcast, or the previous load) and the learner's busy time since
        ``t0``."""
        r = self.recipe
        stalls = await self.finish_reload()
        self.reload = None
        if self.transfer_active:
            try:
                took = await timed(
                    asyncio.gather(*[lr.send_weights.remote(new_version) for lr in self.learners]),
                    r.generator.weight_sync_timeout_s + 30,
                    f"broadcasting version {new_version}",
                    WeightSyncError,
                )
                self.published_version = new_version
                return [took[0]], time.monotonic() - t0
            except AgentRLError as exc:
                self.transfer_active = False
                self.log.event(f"weight sync over {r.generator.weight_sync} failed, versions go through disk from now on: {exc}", weight_sync_fallbacks=1)
        path = self.run_dir / "weights" / f"v{new_version:06d}"
        await timed(
            asyncio.gather(*[lr.publish.remote(str(path), serving_dtype=True) for lr in self.learners]),
            r.learner.timeout_s,
            f"publishing version {new_version}",
            LearnerError,
        )
        self.published_version = new_version
        learner_busy_s = time.monotonic() - t0  # training + writing the version
        # the generators load it while the learner goes on with the next batch; the step after
        # waits for this load before it publishes (versions arrive in order, one load at a time)
        self.reload = Reload(new_version, asyncio.ensure_future(self._load_version(new_version, path)))
        return stalls, learner_busy_s

    async def finish_reload(self) -> list[float]:
        """Wait for the version the generators are loading (if any); its stalls, seconds."""
        if self.reload is None:
            return []
        return await self.reload.task

    async def _load_version(self, new_version: int, path: Path) -> list[float]:
        """Load the published folder ``path`` into every generator as ``new_version``; replace
        a generator that cannot take it. Returns the generation stalls."""
        r = self.recipe
        targets = list(self.generators)
        outcomes = await timed(
            asyncio.gather(*[g.update_weights.remote(new_version, str(path)) for g in targets], return_exceptions=True),
            r.generator.timeout_s + 30,
            f"loading version {new_version} into the generators",
            GeneratorError,
        )
        stalls = [o for o in outcomes if not isinstance(o, BaseException)]
        broken = [i for i, o in enumerate(outcomes) if isinstance(o, BaseException)]
        if broken:  # a generator that cannot take the new weights is replaced by one that has them
            self.log.event(f"generators {broken} failed to load version {new_version}: {outcomes[broken[0]]!r:.200}")
            await self._heal_generators(new_version, self.log, force=tuple(targets[i] for i in broken))
        await self._catch_up_replacements(targets, new_version)
        return stalls

    async def _connect_weight_transfer(self, log: MetricsLogger) -> None:
        """Form the learner-to-generators transfer group when ``weight_sync`` is a collective;
        if it cannot be formed, say why and go on with disk."""
        g = self.recipe.generator
        self.transfer_active = False
        if g.weight_sync == "disk" or not self.learners:
            return
        world = 1 + len(self.generators) * g.tensor_parallel_size
        try:
            address, port = await timed(self.learners[0].weight_transfer_endpoint.remote(), 60, "choosing the weight-transfer endpoint", WeightSyncError)
            await timed(
                asyncio.gather(*[
                    lr.connect_weight_transfer.remote(g.weight_sync, address, port, world, self.generators, g.weight_sync_timeout_s, self.recipe.model.dtype)
                    for lr in self.learners
                ]),
                g.weight_sync_timeout_s + 30,
                "forming the weight-transfer group",
                WeightSyncError,
            )
        except AgentRLError as exc:
            log.event(f"weight sync over {g.weight_sync} unavailable, versions go through disk: {exc}", weight_sync_fallbacks=1)
            return
        self.transfer_active = True
        log.event(f"weight sync: {g.weight_sync} broadcast from learner rank 0 to {world - 1} generator workers at {address}:{port}")

    async def _generator_busy(self, log: MetricsLogger) -> list[dict[str, Any]]:
        """``stats()`` of every generator, or [] when one does not answer."""
        try:
            return list(await asyncio.wait_for(asyncio.gather(*[g.stats.remote() for g in self.generators]), 30))
        except Exception as exc:  # a dead generator: utilisation is reported without them
            log.event(f"generator statistics unavailable: {type(exc).__name__}: {exc}")
            return []

    async def _log_utilisation(self, log: MetricsLogger, wall_s: float, learner_busy_s: float) -> None:
        """Log the ``utilisation`` record of the RL loop: the fraction of its wall-clock each
        generator had a request in flight and the learner was training or writing weights."""
        gen = []
        for g, s in zip(self.generators, await self._generator_busy(log)):
            # a generator replaced mid-run counts from its start, a fraction of its own lifetime
            busy = s["busy_s"] - self._busy_at_loop_start.get(id(g), 0.0)
            gen.append(min(1.0, busy / max(1e-9, min(wall_s, s["alive_s"]))))
        log.log(
            "utilisation",
            rl_wall_s=wall_s,
            learner_busy_fraction=min(1.0, learner_busy_s / max(1e-9, wall_s)),
            generator_busy_fraction=sum(gen) / len(gen) if gen else float("nan"),
            generator_busy_fractions=gen,
        )

    def _dump_samples(self, examples: list[dict[str, Any]], version: int) -> None:
        """Append a few decoded episodes of the step to ``samples.jsonl`` (for reading, not training)."""
        with (self.run_dir / "samples.jsonl").open("a") as f:
            for ex in examples:
                f.write(json.dumps({"version": version, **ex}) + "\n")

    def _prune_versions(self, newest: int) -> None:
        keep = self.recipe.learner.keep_versions
        for v in range(0, newest - keep + 1):
            old = self.run_dir / "weights" / f"v{v:06d}"
            if old.exists():
                shutil.rmtree(old, ignore_errors=True)

    # ------------------------------------------------------------------ the loop
    async def _loop(self, rows: list[dict[str, Any]], log: MetricsLogger, state: RunState | None) -> RunSummary:
        r = self.recipe
        queue = StalenessQueue(batch_size=r.learner.batch_size, group_size=r.rollout.group_size, max_staleness=r.max_staleness)
        version, cursor = 0, 0
        retry: deque[int] = deque()
        infra_failures = gen_tokens = 0
        if state is not None:
            version, cursor = state.version, state.cursor
            retry.extend(state.reissue)
            for group in state.queued:
                queue._groups.append(group)
            queue.stats = state.stats
            queue.advance(version)
            infra_failures, gen_tokens = state.infra_failures, state.gen_tokens
        pending: dict[asyncio.Future, tuple[int, str]] = {}
        train_task: asyncio.Task | None = None
        training_prompts: list[int] = []
        lost_in_a_row = 0
        attempts: Counter[int] = Counter()  # infra failures per prompt in this process
        abandoned: list[int] = list(getattr(state, "abandoned", []))
        t_start = time.monotonic()
        learner_busy = 0.0  # seconds the learner spent training and writing versions
        self._busy_at_loop_start = {id(g): st["busy_s"] for g, st in zip(self.generators, await self._generator_busy(log))}
        gen_tokens_at_start = gen_tokens
        log.event(f"RL loop started at version {version}", loop_start=True, step=version)
        fault = os.environ.get("AGENTRL_FAULT_KILL_GENERATOR_AFTER_STEP")
        kill_after = int(fault) if fault else None
        wi = 0
        while version < r.learner.max_steps:
            if self.reload is not None and self.reload.task.done() and queue.served_version < self.reload.version:
                self.reload.task.result()  # a load that failed past healing stops the run loudly
                queue.serve(self.reload.version)  # the generators serve it: admit more samples
            while queue.can_start() and (retry or rows):
                idx = retry.popleft() if retry else cursor
                if idx == cursor:
                    cursor += 1
                row = rows[idx % len(rows)]
                gid = f"p{idx}-{attempts[idx]}" if attempts[idx] else f"p{idx}"  # a retry is a new group
                worker = self.workers[wi % len(self.workers)]
                wi += 1
                fut = asyncio.ensure_future(
                    timed(worker.run_group.remote(row, idx, gid, r.rollout.group_size), r.rollout.episode_timeout_s, f"group {gid}")
                )
                pending[fut] = (idx, gid)
                queue.mark_started()
            if kill_after is not None and version >= kill_after and pending:
                # fault injection for tests: a generator dies, as if its node was lost, once the
                # given step is done and episodes are in flight on it
                import ray

                log.event(f"fault injection: killing generator 0 after step {version}")
                ray.kill(self.generators[0], no_restart=True)
                kill_after = None
            if train_task is None and queue.ready():
                batch = queue.take_batch()  # in prompt order: reproducible updates
                training_prompts = [g[0].prompt_index for g in batch if g]
                train_task = asyncio.ensure_future(self._train(batch, version))
            loading = self.reload.task if self.reload is not None and not self.reload.task.done() else None
            waiting = set(pending) | ({train_task} if train_task else set()) | ({loading} if loading else set())
            if not waiting:
                raise AgentRLError("nothing to wait for: no prompts left and no batch ready")
            # each awaited item carries its own timeout; this outer one is a last guard
            limit = r.rollout.episode_timeout_s + r.learner.timeout_s + 2 * r.generator.timeout_s
            done, _ = await asyncio.wait(waiting, timeout=limit, return_when=asyncio.FIRST_COMPLETED)
            if not done:
                raise TimeoutError_(f"no episode group and no learner step finished within {limit:.0f} s")
            for fut in done:
                if fut is loading:  # served at the top of the next round
                    continue
                if fut is train_task:
                    train_task = None
                    stats = fut.result()  # a learner/generator failure stops the run loudly
                    version = stats["version"]
                    learner_busy += stats["learner_busy_s"]
                    self._dump_samples(stats.pop("_examples", []), version)
                    queue.advance(version, served=self.reload is None)
                    now = time.monotonic()
                    with (self.run_dir / "trained.jsonl").open("a") as f:
                        f.write(json.dumps({"step": version, "prompts": training_prompts}) + "\n")
                    log.step(
                        step=version,
                        **stats,
                        gen_tokens_per_s=(gen_tokens - gen_tokens_at_start) / max(1e-9, now - t_start),
                        queue_depth=len(queue),
                        started=queue.stats.started,
                        dropped_stale=queue.stats.dropped_stale,
                        infra_failures=infra_failures,
                        prompt_cursor=cursor,
                    )
                    every = r.checkpoint.every_steps
                    if every and version % every == 0 and version < r.learner.max_steps:
                        await self._checkpoint(
                            RunState(
                                version=version,
                                cursor=cursor,
                                reissue=list(retry) + [idx for idx, _ in pending.values()],
                                queued=list(queue._groups),
                                stats=replace(queue.stats, started=queue.stats.started - r.rollout.group_size * len(pending)),
                                infra_failures=infra_failures,
                                gen_tokens=gen_tokens,
                                evals=list(self.evals),
                                abandoned=list(abandoned),
                            ),
                            log,
                        )
                    if r.eval.every_steps and version % r.eval.every_steps == 0 and version < r.learner.max_steps:
                        await self.finish_reload()  # evaluate the new version, not the one before
                        queue.serve(version)
                        await self._evaluate(version, log)
                    continue
                idx, gid = pending.pop(fut)
                try:
                    group: list[Trajectory] = fut.result()
                except Exception as exc:  # a worker died or timed out: the group is lost
                    group, error = [], f"{type(exc).__name__}: {exc}"
                failed = [t for t in group if not t.trainable]
                infra_failures += len(failed) if group else r.rollout.group_size
                gen_tokens += sum(t.num_generated for t in group)
                if not group or any("GeneratorError" in t.info.get("error", "") for t in failed):
                    await self._heal_generators(version, log)
                if group and len(failed) < len(group):
                    lost_in_a_row = 0
                    queue.put(group)
                    continue
                # nothing of it can be trained: the prompt goes round again rather than filling
                # a batch slot with an empty group, a bounded number of times
                if group:
                    error = failed[0].info.get("error", "") or failed[0].status
                lost_in_a_row += 1
                if lost_in_a_row > 4 * len(self.workers) + 4:
                    raise InfraError(f"rollout keeps failing ({lost_in_a_row} groups lost in a row); last: {error[:300]}")
                queue.mark_lost(r.rollout.group_size)
                attempts[idx] += 1
                if attempts[idx] < _MAX_PROMPT_ATTEMPTS:
                    retry.append(idx)
                    log.event(f"group {gid} failed on infrastructure ({error[:200]}); re-issued")
                else:
                    abandoned.append(idx)
                    log.event(f"group {gid} failed on infrastructure {attempts[idx]} times ({error[:200]}); abandoned")
        for fut in pending:
            fut.cancel()
        await self.finish_reload()  # the final evaluation runs on the final weights
        await self._log_utilisation(log, time.monotonic() - t_start, learner_busy)
        final = self.run_dir / "final"
        await timed(
            asyncio.gather(*[lr.publish.remote(str(final), with_tokenizer=True, serving_dtype=True) for lr in self.learners]),
            r.learner.timeout_s,
            "writing the final checkpoint",
            LearnerError,
        )
        log.event(f"final checkpoint: {final}", version=version)
        return RunSummary(
            run_dir=self.run_dir,
            steps=version,
            version=version,
            final_checkpoint=final,
            samples_trained=queue.stats.trained,
            dropped_stale=queue.stats.dropped_stale,
            infra_failures=infra_failures,
            prompt_cursor=cursor,
            untrained_prompts=sorted([idx for idx, _ in pending.values()] + list(retry) + [g[0].prompt_index for g in queue._groups if g]),
            dropped_prompts=list(queue.stats.dropped_prompts),
            abandoned_prompts=abandoned,
        )

    async def _run(self) -> RunSummary:
        import ray

        from agentrl.envs.data import load_rows

        r = self.recipe
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "recipe.json").write_text(json.dumps(r.model_dump(mode="json"), indent=2))
        log = self.log = MetricsLogger(self.run_dir, max_steps=r.learner.max_steps, sinks=self._metric_sinks())
        rows = load_rows(r.data.source, split=r.data.split, fields=r.data.fields or None, limit=r.data.limit, seed=r.seed)
        model = prepare_model(r, rows, log)
        started_ray = self._start_ray()
        self.generators, self.learners, self.workers = [], [], []
        try:
            log.event(f"run {r.name}: mode={r.mode} max_staleness={r.max_staleness} rows={len(rows)} model={model}")
            self.evals: list[dict[str, Any]] = []
            if r.sft.steps:
                model = await self._sft(model, log)
            if r.mode == "sft":
                summary = RunSummary(self.run_dir, r.sft.steps, 0, Path(model), 0, 0, 0)
                self._write_summary(summary)
                return summary
            self.tokenizer_source = model
            state = None
            ckpt = latest_checkpoint(self.run_dir) if r.checkpoint.resume and r.mode in ("async", "sync") else None
            if ckpt is not None:
                state = read_state(ckpt)
                truncate_logs(self.run_dir, state.version)
                self.evals = list(state.evals)
                model = str(ckpt / "weights")
                log.event(f"resuming from {ckpt} (step {state.version}, {len(state.reissue)} prompts re-issued)", step=state.version)
            await self._start_actors(model, log, with_learners=r.mode != "eval", version=state.version if state else 0)
            if ckpt is not None:
                await timed(
                    asyncio.gather(*[lr.load_checkpoint.remote(str(ckpt / "learner")) for lr in self.learners]),
                    r.learner.timeout_s, "loading the learner checkpoint", LearnerError,
                )
            await self._connect_weight_transfer(log)
            if (r.eval.limit or r.mode == "eval") and state is None:
                self.eval_rows = load_rows(
                    r.eval.source or r.data.source, split=r.eval.split,
                    fields=(r.eval.fields if r.eval.fields is not None else r.data.fields) or None, limit=r.eval.limit or None, seed=r.seed
                )
                await self._evaluate(0, log)
            if r.mode == "eval":
                summary = RunSummary(self.run_dir, 0, 0, Path(model), 0, 0, 0)
                self._write_summary(summary)
                return summary
            if r.eval.limit and state is not None:
                self.eval_rows = load_rows(
                    r.eval.source or r.data.source, split=r.eval.split,
                    fields=(r.eval.fields if r.eval.fields is not None else r.data.fields) or None, limit=r.eval.limit, seed=r.seed
                )
            summary = await self._loop(rows, log, state)
            if r.eval.limit:
                await self._evaluate(summary.version, log)
            self._write_summary(summary)
            return summary
        finally:
            await self._shutdown()
            log.close()
            if started_ray:
                ray.shutdown()

    def _metric_sinks(self) -> list[Any]:
        """W&B when ``[wandb] project`` is set."""
        w = self.recipe.wandb
        if w.project is None:
            return []
        from agentrl.engine.metric_sinks import WandbSink

        return [WandbSink(
            project=w.project, entity=w.entity, name=w.name or self.recipe.name, mode=w.mode, tags=w.tags,
            directory=self.run_dir, config=self.recipe.model_dump(mode="json"),
        )]

    async def _checkpoint(self, state: RunState, log: MetricsLogger) -> Path:
        """Write ``checkpoints/step_N``: learner state (every rank), weights of version N, controller state."""
        r = self.recipe
        root = self.run_dir / "checkpoints"
        final = root / f"step_{state.version:06d}"
        tmp = root / f".step_{state.version:06d}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        t0 = time.monotonic()
        await timed(
            asyncio.gather(*[lr.save_checkpoint.remote(str(tmp / "learner")) for lr in self.learners]),
            r.learner.timeout_s, f"saving learner checkpoint {state.version}", LearnerError,
        )
        published = self.run_dir / "weights" / f"v{state.version:06d}"
        if published.exists():  # hard links: no copy, and pruning the version later keeps them
            await asyncio.to_thread(link_tree, published, tmp / "weights")
        else:  # a collective weight sync wrote no folder for this version: the learner writes one
            await timed(
                asyncio.gather(*[lr.publish.remote(str(tmp / "weights"), serving_dtype=True) for lr in self.learners]),
                r.learner.timeout_s, f"writing the weights of checkpoint {state.version}", LearnerError,
            )
        from agentrl.models.loading import load_tokenizer

        if not (tmp / "weights" / "tokenizer_config.json").exists():  # never write into a linked file
            load_tokenizer(self.tokenizer_source or str(tmp / "weights")).save_pretrained(tmp / "weights")  # self-contained
        write_checkpoint_state(tmp, state)
        await asyncio.to_thread(shutil.rmtree, final, True)
        os.replace(tmp, final)
        await asyncio.to_thread(prune_checkpoints, self.run_dir, r.checkpoint.keep)
        log.event(f"checkpoint {final.name} ({time.monotonic() - t0:.1f} s)", step=state.version)
        return final

    async def _sft(self, model: str, log: MetricsLogger) -> str:
        """Supervised warm-up on demonstrations; returns the folder of the warmed-up model.
        A run directory that already holds it (a resumed run) skips the stage."""
        import random

        import ray

        from agentrl.engine.sft import encode_chat, load_conversations
        from agentrl.models.loading import load_tokenizer

        r = self.recipe
        cfg = r.sft
        out = self.run_dir / "sft"
        if (out / "config.json").exists():
            log.event(f"SFT stage already done: {out}")
            return str(out)
        tok = load_tokenizer(model)
        samples = [encode_chat(tok, c) for c in load_conversations(cfg.source, cfg.num_examples, r.seed)]
        env_vars = {"TOKENIZERS_PARALLELISM": "false"}
        learners = self._learner_actors(
            model, env_vars=env_vars, lr=cfg.lr, torch_threads=cfg.torch_threads, warmup_steps=cfg.warmup_steps,
            for_rl=False, total_steps=cfg.steps, lr_schedule=cfg.lr_schedule,
        )
        self.learners = learners  # shut down with the rest on failure
        await timed(asyncio.gather(*[a.setup.remote() for a in learners]), r.learner.timeout_s, "SFT learner set-up", LearnerError)
        log.event(f"SFT: {cfg.steps} steps x {cfg.batch_size} of {len(samples)} conversations from {cfg.source}")
        rng = random.Random(r.seed)
        t0 = time.monotonic()
        tokens = 0.0
        for step in range(1, cfg.steps + 1):
            batch = rng.sample(samples, min(cfg.batch_size, len(samples)))
            res = await timed(asyncio.gather(*[a.sft_step.remote(batch) for a in learners]), r.learner.timeout_s, f"SFT step {step}", LearnerError)
            tokens += res[0]["trained_tokens"]
            if step % 25 == 0 or step == cfg.steps:
                m = res[0]
                rec = log.log("sft", step=step, **m, elapsed_s=time.monotonic() - t0)
                log.console.print(
                    f"sft {step:>5}/{cfg.steps}  loss {m['sft_loss']:.4f}  lr {m['lr']:.2e}  "
                    f"{tokens / max(1e-9, time.monotonic() - t0):.0f} trained tok/s  t={rec['time']:.0f}s"
                )
        await timed(asyncio.gather(*[a.publish.remote(str(out), True) for a in learners]), r.learner.timeout_s, "writing the SFT model", LearnerError)
        await asyncio.gather(*[a.shutdown.remote() for a in learners], return_exceptions=True)
        for a in learners:
            ray.kill(a, no_restart=True)
        self.learners = []
        self._release_learner_placement()
        log.event(f"SFT done in {time.monotonic() - t0:.0f} s: {out}")
        return str(out)

    async def _evaluate(self, version: int, log: MetricsLogger) -> dict[str, Any]:
        """Greedy (by default) episodes on the held-out rows with the generators' current weights."""
        from agentrl.engine.evaluation import evaluate

        r = self.recipe
        t0 = time.monotonic()
        metrics, trajs = await evaluate(
            self.workers, self.eval_rows, {"temperature": r.eval.temperature}, timeout_s=r.eval.timeout_s
        )
        rec = log.log("eval", version=version, **metrics, eval_s=time.monotonic() - t0)
        self.evals.append(rec)
        log.console.print(
            f"[bold]eval v{version}[/]: accuracy {metrics['accuracy']:.3f}  tool-call rate "
            f"{metrics['tool_call_rate']:.3f}  turns {metrics['turns_mean']:.2f}  "
            f"({int(metrics['episodes'])} episodes, {time.monotonic() - t0:.0f} s)"
        )
        with (self.run_dir / "eval_samples.jsonl").open("a") as f:
            for t in trajs[:4]:
                f.write(json.dumps({"version": version, "reward": t.reward, "status": t.status, "text": t.info.get("text", "")}) + "\n")
        return rec

    def _write_summary(self, summary: RunSummary) -> None:
        """``summary.json``: the run's outcome, with evaluation before and after RL."""
        data: dict[str, Any] = {
            "steps": summary.steps,
            "version": summary.version,
            "samples_trained": summary.samples_trained,
            "dropped_stale": summary.dropped_stale,
            "infra_failures": summary.infra_failures,
            "final_checkpoint": str(summary.final_checkpoint),
            "prompt_cursor": summary.prompt_cursor,
            "untrained_prompts": summary.untrained_prompts,
            "dropped_prompts": summary.dropped_prompts,
            "abandoned_prompts": summary.abandoned_prompts,
        }
        if self.evals:
            data["eval_before"] = self.evals[0]
            data["eval_after"] = self.evals[-1]
            data["accuracy_gain"] = self.evals[-1]["accuracy"] - self.evals[0]["accuracy"]
        (self.run_dir / "summary.json").write_text(json.dumps(data, indent=2))

    async def _shutdown(self) -> None:
        import ray

        if self.reload is not None and not self.reload.task.done():
            self.reload.task.cancel()
        calls = [w.shutdown.remote() for w in self.workers] + [g.shutdown.remote() for g in self.generators]
        calls += [lr.shutdown.remote() for lr in self.learners]
        if calls:
            try:
                await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 60)
            except asyncio.TimeoutError:
                pass
        for a in [*self.workers, *self.generators, *self.learners]:
            ray.kill(a, no_restart=True)
        self._release_learner_placement()

    def _release_learner_placement(self) -> None:
        """Free the learner ranks' reserved resources (after their actors are gone)."""
        if self._learner_placement is not None:
            self._learner_placement.release()
            self._learner_placement = None

    def run(self) -> RunSummary:
        """Run the recipe to the end and return its summary."""
        return asyncio.run(self._run())
