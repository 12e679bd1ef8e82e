"""Recipe → plain arguments for every component: the one place that reads the recipe's sections
on behalf of the engine's parts (they receive values, never the recipe).

Pure functions: no Ray, no processes, no files touched.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from agentrl.config import Recipe
from agentrl.engine.common.audit import episodes_audit_path, learner_audit_path
from agentrl.engine.common.sampling import Sampling
from agentrl.engine.episodes.runner import EpisodeSettings
from agentrl.engine.loop.batching import BatchSettings, no_signal_reason
from agentrl.engine.loop.critic_stage import GaeSettings
from agentrl.engine.generation.engine_config import EngineSettings
from agentrl.engine.loop.loop import LoopSettings
from agentrl.engine.rewards.scoring_bundle import ScoringSettings
from agentrl.engine.training.lora import LoraSettings, vllm_max_lora_rank

__all__ = [
    "ACTOR_ENV_VARS",
    "JOB_RUNTIME_ENV",
    "ActorSpec",
    "actor_runtime_env",
    "batch_settings",
    "critic_kwargs",
    "gae_settings",
    "engine_settings",
    "episode_settings",
    "generator_actor",
    "generator_count",
    "learner_kwargs",
    "lora_settings",
    "ledger_kwargs",
    "loop_settings",
    "job_runtime_env",
    "ray_init_kwargs",
    "judge_actors",
    "reward_cpus",
    "reward_function_specs",
    "reward_kwargs",
    "reward_model_actor",
    "rollout_sampling",
    "scoring_settings",
    "sleep_level",
    "worker_kwargs",
]

ACTOR_ENV_VARS: dict[str, str] = {"VLLM_LOGGING_LEVEL": "WARNING", "TOKENIZERS_PARALLELISM": "false", "TQDM_DISABLE": "1"}
"""Environment of every actor the engine starts: quiet vLLM, no tokenizer thread pools, no
progress bars."""


JOB_RUNTIME_ENV: dict[str, Any] = {"worker_process_setup_hook": "agentrl.engine.common.cluster.redirect_actor_output"}
"""The run's job-level Ray ``runtime_env``: every worker process runs
:func:`agentrl.engine.common.cluster.redirect_actor_output` when it starts (Ray takes setup hooks at the
job level only), which sends the output of actors given a log file to that file."""


def actor_runtime_env(log_dir: Path, name: str, cpus: list[int] | None = None) -> dict[str, Any]:
    """The Ray ``runtime_env`` of the engine actor ``name`` (``generator-0``, ``learner-1``,
    ``rollout-0``): :data:`ACTOR_ENV_VARS`, its output (vLLM's, Ray's, transformers') appended to
    ``log_dir/<name>.log`` instead of the console, and its process pinned to ``cpus`` when given
    (both by the job's setup hook, :data:`JOB_RUNTIME_ENV`)."""
    from agentrl.engine.common.cluster import ACTOR_CPUS_ENV, ACTOR_LOG_ENV

    env = {**ACTOR_ENV_VARS, ACTOR_LOG_ENV: str(Path(log_dir).resolve() / f"{name}.log")}
    if cpus:
        env[ACTOR_CPUS_ENV] = ",".join(str(c) for c in cpus)
    return {"env_vars": env}


def ray_init_kwargs(recipe: Recipe) -> dict[str, Any]:
    """``ray.init`` arguments: join ``ray.address`` when set, else start a local cluster with
    enough CPUs for every actor (``ray.num_cpus`` overrides)."""
    r = recipe
    if r.ray.address:
        return {"address": r.ray.address, "logging_level": "warning", "log_to_driver": False, "runtime_env": job_runtime_env(r)}
    need = (
        r.generator.num_generators * r.generator.num_cpus
        + r.rollout.num_workers * r.rollout.num_cpus
        + r.learner.num_ranks * r.learner.num_cpus
        + (r.critic_settings.num_ranks * r.critic_settings.num_cpus if r.algo.advantage == "gae" else 0)
    )
    return {
        "num_cpus": r.ray.num_cpus or max(2, int(need + reward_cpus(r) + 0.999)),
        "include_dashboard": False,
        "logging_level": "warning",
        "log_to_driver": False,  # actors write to RUN_DIR/logs (actor_runtime_env); errors come back as exceptions
        "runtime_env": job_runtime_env(r),
    }


def job_runtime_env(recipe: Recipe) -> dict[str, Any]:
    """The Ray job's ``runtime_env``: :data:`JOB_RUNTIME_ENV`, plus the user's modules the recipe
    names (``py_modules``) and the directories the CLI put on ``sys.path`` (``PYTHONPATH``):
    :func:`agentrl.user_code.user_runtime_env`."""
    from agentrl.user_code import user_runtime_env

    return {**JOB_RUNTIME_ENV, **user_runtime_env(recipe.model_dump(mode="json"))}


def learner_kwargs(
    recipe: Recipe, *, model: str, tokenizer: str | None, run_dir: Path, stage: Literal["rl", "sft"] = "rl"
) -> dict[str, Any]:
    """Keyword arguments of every learner rank (:class:`agentrl.engine.training.learner.Learner`) except
    ``rank``, ``world_size``, ``master_addr`` and ``master_port``.

    ``model``: the weights to start from (the initial model, or a checkpoint's weights on a
    resume); ``tokenizer``: the RL starting point the tokenizer and the KL reference come from
    (None: ``model``). ``stage = "rl"`` trains the RL objective (``learner.lr_schedule`` over
    ``max_steps * updates_per_batch`` steps, the KL term, the rollout temperature); ``"sft"``
    the supervised warm-up with ``[sft]``'s rate, warm-up, threads and schedule over
    ``sft.steps``."""
    from agentrl.algos import ObjectiveSettings

    r = recipe
    lcfg, a = r.learner, r.algo
    rl = stage == "rl"
    objective = ObjectiveSettings(
        policy_loss=a.policy_loss, clip_low=a.clip_low, clip_high=a.clip_high, dual_clip=a.dual_clip,
        off_policy=a.off_policy, is_cap=a.is_cap, ratio_band=tuple(a.ratio_band) if a.ratio_band else None,
        loss_agg=a.loss_agg, kl_coef=a.kl_coef if rl else 0.0, kl_estimator=a.kl_estimator,
    )
    if rl:
        lr, warmup, threads = lcfg.lr, lcfg.warmup_steps, lcfg.torch_threads
        total_steps: int | None = lcfg.max_steps * a.updates_per_batch
        schedule = lcfg.lr_schedule
    else:
        lr, warmup, threads = r.sft.lr, r.sft.warmup_steps, r.sft.torch_threads
        total_steps, schedule = r.sft.steps, r.sft.lr_schedule
    return {
        "world_size": lcfg.num_ranks,
        "model": model,
        "dtype": r.model.dtype,
        "lr": lr,
        "betas": lcfg.betas,
        "weight_decay": lcfg.weight_decay,
        "adam_eps": lcfg.adam_eps,
        "grad_clip": lcfg.grad_clip,
        "warmup_steps": warmup,
        "lr_schedule": schedule,
        "total_steps": total_steps,
        "min_lr_ratio": lcfg.min_lr_ratio,
        "micro_batch_tokens": lcfg.micro_batch_tokens,
        "logprob_chunk_tokens": lcfg.logprob_chunk_tokens,
        "activation_checkpointing": lcfg.activation_checkpointing,
        "pack_microbatches": lcfg.pack_microbatches,
        "shared_prefixes": lcfg.shared_prefixes,
        "attn_implementation": r.model.attn_implementation,
        "compute_entropy": lcfg.compute_entropy,
        "objective": objective,
        "updates_per_batch": a.updates_per_batch if rl else 1,
        "proximal": a.proximal,
        # on a resume ``model`` is a checkpoint: the KL anchor and the tokenizer stay the RL
        # starting point
        "reference_model": lcfg.reference_model or tokenizer or model,
        "tokenizer": tokenizer or model,
        "torch_threads": threads,
        "timeout_s": lcfg.timeout_s,
        "seed": r.seed,
        "audit_path": str(learner_audit_path(run_dir)),
        "temperature": rollout_sampling(r).temperature if rl else 1.0,
        "lora": lora_settings(r).as_dict() if r.lora is not None else None,
    }


def critic_kwargs(recipe: Recipe, *, model: str) -> dict[str, Any]:
    """Keyword arguments of every critic rank (:class:`agentrl.engine.training.critic.Critic`) except
    ``rank``, ``master_addr`` and ``master_port``; ``model``: the weights RL starts from, used
    when ``critic.model`` is not set."""
    r = recipe
    c = r.critic_settings
    return {
        "world_size": c.num_ranks,
        "model": c.model or model,
        "lr": c.lr,
        "betas": r.learner.betas,
        "weight_decay": c.weight_decay,
        "grad_clip": c.grad_clip,
        "value_clip": c.value_clip,
        "updates_per_batch": c.updates_per_batch,
        "micro_batch_tokens": c.micro_batch_tokens,
        "torch_threads": c.torch_threads,
        "timeout_s": c.timeout_s,
        "seed": r.seed,
        "dtype": r.model.dtype,
        "activation_checkpointing": (
            r.learner.activation_checkpointing if c.activation_checkpointing is None else c.activation_checkpointing
        ),
    }


def gae_settings(recipe: Recipe) -> GaeSettings:
    """GAE's numbers from the recipe's ``[algo]``."""
    a = recipe.algo
    return GaeSettings(gamma=a.gae_gamma, lam=a.gae_lambda, normalize=a.normalize_advantages)


def engine_settings(recipe: Recipe, *, model: str, tokenizer: str | None) -> EngineSettings:
    """Settings of every vLLM engine, serving ``model`` with ``tokenizer`` (None: ``model``'s)."""
    r = recipe
    g = r.generator
    return EngineSettings(
        model=model,
        tokenizer=tokenizer or model,
        dtype=r.model.dtype,
        max_model_len=g.max_model_len,
        kv_cache_gib=g.kv_cache_gib,
        gpu_memory_utilization=g.gpu_memory_utilization,
        enforce_eager=g.enforce_eager,
        enable_prefix_caching=g.enable_prefix_caching,
        block_size=g.block_size,
        cpu_threads_bind=g.cpu_threads_bind,
        cpu_engine_processes=g.engine_processes(),
        seed=r.seed,
        weight_transfer=None if g.weight_sync == "disk" else g.weight_sync,
        recompute_kv_on_update=g.recompute_kv_on_update,
        max_lora_rank=vllm_max_lora_rank(r.lora.rank) if r.lora is not None else None,
        max_loras=r.lora.max_loras if r.lora is not None else 4,
        sleep_mode=sleep_level(r) > 0,
        # tensor parallelism inside the actor: vLLM's workers are processes that see the actor's
        # GPUs (the Ray executor would ask Ray for GPUs the actor already holds)
        extra={
            **({"tensor_parallel_size": g.tensor_parallel_size, "distributed_executor_backend": "mp"} if g.tensor_parallel_size > 1 else {}),
            **{k: v for k, v in (("max_num_seqs", g.max_num_seqs), ("max_num_batched_tokens", g.max_num_batched_tokens)) if v is not None},
        },
    )


def rollout_sampling(recipe: Recipe) -> Sampling:
    """The run's sampling (``[rollout]`` temperature, top_p, stop), read here once: the rollout
    workers sample with it and the learner computes its log-probs at its temperature."""
    ro = recipe.rollout
    return Sampling(temperature=ro.temperature, top_p=ro.top_p, stop=tuple(ro.stop))


def worker_kwargs(recipe: Recipe, *, tokenizer: str, run_dir: Path) -> dict[str, Any]:
    """Keyword arguments of every rollout worker (:class:`agentrl.engine.episodes.rollout.RolloutWorker`)
    except ``generators`` and the reward actors' handles: ``episodes`` (:func:`episode_settings`),
    ``scoring`` (:func:`scoring_settings`), ``max_concurrent_episodes``, ``generate_timeout_s``
    and ``audit_path`` (the run's episode audit log in ``run_dir``)."""
    r = recipe
    return {
        "episodes": episode_settings(r, tokenizer=tokenizer),
        "scoring": scoring_settings(r),
        "max_concurrent_episodes": r.rollout.max_concurrent_episodes,
        "generate_timeout_s": r.generator.timeout_s,
        "audit_path": str(episodes_audit_path(run_dir)),
    }


def episode_settings(recipe: Recipe, *, tokenizer: str) -> EpisodeSettings:
    """What the rollout workers' episodes are (``[env]``, ``[sandbox]``, ``[rollout]``, the seed),
    with the policy's ``tokenizer``; an episode is bounded by the generator's ``max_model_len`` too."""
    r = recipe
    ro = r.rollout
    return EpisodeSettings(
        tokenizer=tokenizer,
        env_id=r.env.id,
        env_kwargs=r.env.kwargs,
        sandbox_kind=r.sandbox.type,
        sandbox_kwargs={
            "max_concurrency": r.sandbox.max_concurrency,
            "timeout_s": r.sandbox.timeout_s,
            "memory_mb": r.sandbox.memory_mb,
            **({"preload": r.sandbox.preload} if r.sandbox.preload is not None else {}),
        },
        sampling=rollout_sampling(r),
        max_new_tokens=ro.max_new_tokens,
        max_episode_tokens=min(ro.max_episode_tokens, r.generator.max_model_len),
        seed=r.seed,
        seed_sampling=ro.seed_sampling,
        **({"agent": r.env.agent, "agent_model": r.env.agent_model, "agent_max_calls": r.env.agent_max_calls,
            "agent_timeout_s": r.env.agent_timeout_s} if r.env.agent else {}),
    )


def scoring_settings(recipe: Recipe) -> ScoringSettings:
    """The rollout workers' model-based rewards (``[reward]``; :func:`reward_kwargs` are its fields)."""
    return ScoringSettings(**reward_kwargs(recipe))


def batch_settings(recipe: Recipe) -> BatchSettings:
    """How the recipe's ``[algo]`` turns rewards into advantages."""
    a = recipe.algo
    return BatchSettings(
        advantage=a.advantage,
        dynamic_sampling=a.dynamic_sampling,
        solved_reward=a.solved_reward,
        overlong_max_tokens=a.overlong_max_tokens,
        overlong_buffer_tokens=a.overlong_buffer_tokens,
    )


@dataclass(frozen=True)
class ActorSpec:
    """What to start as an actor: ``cls(*args, **kwargs)`` with Ray ``options``."""

    cls: type
    options: dict[str, Any]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


def generator_actor(recipe: Recipe, settings: EngineSettings, version: int, index: int, log_dir: Path) -> ActorSpec:
    """Generator number ``index`` serving ``settings.model`` as ``version``: a vLLM engine, or
    with ``generator.backend = "http"`` a client of ``generator.urls[index]`` that loads
    ``settings.model`` into the server when it is a local folder (an SFT stage, a resumed
    checkpoint, a replacement mid-run); a hub id is taken to be what the server serves. Its
    output goes to ``log_dir/generator-<index>.log``."""
    g = recipe.generator
    runtime_env = actor_runtime_env(log_dir, f"generator-{index}", g.cpu_affinity)
    if g.backend == "http":
        from agentrl.engine.generation.http_generator import HttpGenerator

        load = str(Path(settings.model).resolve()) if Path(settings.model).is_dir() else None
        return ActorSpec(HttpGenerator, {"num_cpus": 0.1, "runtime_env": runtime_env}, (g.urls[index],),
                         {"timeout_s": g.timeout_s, "version": version, "load": load})
    from agentrl.engine.generation.generator import VllmGenerator
    options = {"num_cpus": g.num_cpus, "num_gpus": g.num_gpus, "resources": dict(g.resources) or None, "runtime_env": runtime_env}
    return ActorSpec(VllmGenerator, options, (settings,), {"timeout_s": g.timeout_s, "version": version})


def generator_count(recipe: Recipe) -> int:
    """Generators of the run: one per URL with the HTTP backend, else ``num_generators``."""
    g = recipe.generator
    return len(g.urls) if g.backend == "http" else g.num_generators


def loop_settings(recipe: Recipe) -> LoopSettings:
    """The RL loop's numbers."""
    r = recipe
    return LoopSettings(
        max_steps=r.learner.max_steps,
        group_size=r.rollout.group_size,
        episode_timeout_s=r.rollout.episode_timeout_s,
        # each awaited item carries its own timeout; this outer one is a last guard
        stuck_timeout_s=r.rollout.episode_timeout_s + r.learner.timeout_s + 2 * r.generator.timeout_s,
        checkpoint_every=r.checkpoint.every_steps,
        checkpoint_every_s=60.0 * r.checkpoint.every_minutes,
        checkpoint_first_step=r.checkpoint.first_step,
        checkpoint_at_eval=r.checkpoint.at_eval,
        eval_every=r.eval.every_steps,
        max_degenerate_steps=r.learner.max_degenerate_steps,
        max_episode_tokens=min(r.rollout.max_episode_tokens, r.generator.max_model_len),
        colocated=r.placement.mode == "colocated",
        sleep_level=sleep_level(r),
        offload_learner=r.learner.offload_states and sleep_level(r) > 0 and r.generator.num_gpus > 0,
    )


def sleep_level(recipe: Recipe) -> int:
    """How deep the generators sleep while the learner trains: colocated on GPUs, 1 with LoRA
    (the base weights stay, in host memory) and 2 otherwise (the weights are replaced by the new
    version); colocated on CPUs 1 (the engine's processes are stopped: they keep everything and
    hold no core, :mod:`agentrl.engine.generation.freeze`); 0 (no sleep) separate."""
    r = recipe
    if r.placement.mode != "colocated":
        return 0
    if r.generator.num_gpus == 0:
        return 1
    return 1 if r.lora is not None else 2


def queue_kwargs(recipe: Recipe) -> dict[str, Any]:
    """Arguments of the run's :class:`~agentrl.engine.loop.staleness.StalenessQueue`: under
    ``algo.dynamic_sampling = "refill"`` it sets aside groups without a learning signal
    (:func:`~agentrl.engine.loop.batching.no_signal_reason`) and refills up to
    ``(max_sampling_factor - 1) * batch groups`` of them per batch."""
    r = recipe
    kwargs: dict[str, Any] = {"batch_size": r.learner.batch_size, "group_size": r.rollout.group_size, "max_staleness": r.max_staleness}
    if r.algo.dynamic_sampling == "refill":
        kwargs["classify"] = functools.partial(no_signal_reason, settings=batch_settings(r))
        kwargs["refill_groups"] = int((r.algo.max_sampling_factor - 1) * (r.learner.batch_size // r.rollout.group_size))
    return kwargs


def ledger_kwargs(recipe: Recipe, num_rows: int) -> dict[str, Any]:
    """Arguments of the run's :class:`~agentrl.engine.loop.ledger.PromptLedger` over ``num_rows``
    dataset rows: a run stops when more groups are lost in a row than four per rollout worker
    (plus four)."""
    return {"num_rows": num_rows, "group_size": recipe.rollout.group_size, "max_lost_in_a_row": 4 * recipe.rollout.num_workers + 4}


def lora_settings(recipe: Recipe) -> LoraSettings:
    """The adapter's shape (the recipe must have a ``[lora]`` section)."""
    lo = recipe.lora
    assert lo is not None
    return LoraSettings(
        rank=lo.rank, alpha=lo.alpha, dropout=lo.dropout, target_modules=lo.target_modules, modules_to_save=list(lo.modules_to_save)
    )


def reward_kwargs(recipe: Recipe) -> dict[str, Any]:
    """The fields of the rollout workers' :class:`~agentrl.engine.rewards.scoring_bundle.ScoringSettings`
    that the recipe sets (``[reward]``; none when the reward is the environment's alone): ``reward``
    (:class:`~agentrl.engine.rewards.scoring.RewardSettings`, with the reward functions of
    ``reward.functions``), ``judge``
    (:class:`~agentrl.engine.rewards.judge.JudgeSettings`) and ``judge_tokenizer`` (a separate judge
    model's). The actor handles (``judge_generators``, ``reward_model``) are the controller's."""
    from agentrl.engine.rewards.judge import JudgeSettings
    from agentrl.engine.rewards.scoring import RewardSettings

    rw = recipe.reward
    j, m = rw.judge, rw.model
    if j is None and m is None and not rw.functions and rw.env_weight == 1.0:
        return {}
    out: dict[str, Any] = {"reward": RewardSettings(
        env_weight=rw.env_weight, judge_weight=j.weight if j is not None else 0.0, rm_weight=m.weight if m is not None else 0.0,
        rm_timeout_s=m.timeout_s if m is not None else 60.0, rm_prompt_field=m.prompt_field if m is not None else "question",
        functions=reward_function_specs(recipe),
    )}
    if j is not None:
        out["judge"] = JudgeSettings(
            template=j.template, score_pattern=j.score_pattern, score_min=j.score_min, score_max=j.score_max,
            max_tokens=j.max_tokens, temperature=j.temperature, timeout_s=j.timeout_s, output_regex=j.output_regex,
        )
        if j.model != "policy":
            out["judge_tokenizer"] = j.model
    return out


def reward_function_specs(recipe: Recipe) -> tuple[Any, ...]:
    """The user's reward functions of ``reward.functions``, as
    :class:`~agentrl.engine.rewards.functions.RewardFunctionSpec` (recipe order; keys
    ``reward.functions[i].fn`` for messages)."""
    from agentrl.engine.rewards.functions import function_specs

    return function_specs([(f.fn, f.weight, f.timeout_s) for f in recipe.reward.functions])


def reward_cpus(recipe: Recipe) -> float:
    """Ray CPUs of the reward actors: a separate judge's generators and the reward model."""
    j, m = recipe.reward.judge, recipe.reward.model
    return (j.num_generators * j.num_cpus if j is not None and j.model != "policy" else 0.0) + (m.num_cpus if m is not None else 0.0)


def model_context_length(model: str) -> int | None:
    """The longest sequence ``model`` was made for (``max_position_embeddings`` of its
    ``config.json``, or of its ``text_config``) when ``model`` is a local folder; None when it is
    not, or does not say."""
    import json

    path = Path(model) / "config.json"
    if not path.is_file():
        return None
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    for section in (config, config.get("text_config") or {}):
        n = section.get("max_position_embeddings")
        if isinstance(n, int) and n > 0:
            return n
    return None


def judge_engine_settings(recipe: Recipe) -> EngineSettings:
    """The engine of a separate judge model, from the judge's own model and ``reward.judge.num_gpus``
    rather than the policy's: tensor parallel over its ``num_gpus`` (when more than 1), a GPU
    memory share scaled by a fractional ``num_gpus``, ``max_model_len`` no longer than its model's
    own context (when its folder says), vLLM's default batch sizes, and no weight transfer,
    adapters or sleep (it serves version 0 for good). The rest (dtype, prefix caching, eager mode,
    the CPU settings) as the policy's generators."""
    from dataclasses import replace

    j = recipe.reward.judge
    assert j is not None and j.model != "policy"
    base = engine_settings(recipe, model=j.model, tokenizer=None)
    tp = int(j.num_gpus) if j.num_gpus > 1 else 1
    context = model_context_length(j.model)
    return replace(
        base,
        max_model_len=min(base.max_model_len, context) if context is not None else base.max_model_len,
        gpu_memory_utilization=base.gpu_memory_utilization * min(1.0, j.num_gpus) if j.num_gpus > 0 else base.gpu_memory_utilization,
        weight_transfer=None,
        max_lora_rank=None,
        sleep_mode=False,
        extra={"tensor_parallel_size": tp, "distributed_executor_backend": "mp"} if tp > 1 else {},
    )


def judge_actors(recipe: Recipe, log_dir: Path) -> list[ActorSpec]:
    """The generators of a separate judge model (none when the judge is the policy, or there is
    none): vLLM engines serving ``reward.judge.model`` as version 0 for good
    (:func:`judge_engine_settings`); output to ``log_dir/judge-<i>.log``."""
    from agentrl.engine.generation.generator import VllmGenerator

    j = recipe.reward.judge
    if j is None or j.model == "policy":
        return []
    settings = judge_engine_settings(recipe)
    return [
        ActorSpec(VllmGenerator, {"num_cpus": j.num_cpus, "num_gpus": j.num_gpus, "runtime_env": actor_runtime_env(log_dir, f"judge-{i}")},
                  (settings,), {"timeout_s": j.timeout_s, "version": 0})
        for i in range(j.num_generators)
    ]


def reward_model_actor(recipe: Recipe, log_dir: Path) -> ActorSpec | None:
    """The reward model's server (None without ``[reward.model]``); output to ``log_dir/reward-model.log``."""
    from agentrl.engine.rewards.reward_model import RewardModelServer

    m = recipe.reward.model
    if m is None:
        return None
    options = {"num_cpus": m.num_cpus, "num_gpus": m.num_gpus, "runtime_env": actor_runtime_env(log_dir, "reward-model")}
    return ActorSpec(RewardModelServer, options, (m.path,), {
        "max_batch_size": m.max_batch_size, "max_wait_ms": m.max_wait_ms, "max_length": m.max_length,
        "device": "cuda" if m.num_gpus > 0 else "cpu", "dtype": m.dtype, "torch_threads": m.torch_threads, "seed": recipe.seed,
    })
