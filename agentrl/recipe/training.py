"""Training: the learner, the RL objective, PPO's critic, the supervised warm-up and LoRA.

Sections of the recipe (:class:`agentrl.config.Recipe`); import them from :mod:`agentrl.config`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, NonNegativeInt, model_validator

from agentrl.recipe.section import Section

__all__ = ["LearnerConfig", "AlgoConfig", "CriticConfig", "SftConfig", "LoraConfig", "GROUP_RELATIVE"]


class LearnerConfig(Section):
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
    pack_microbatches: Literal["auto", "on", "off"] = "auto"
    """Lay each micro-batch's samples end to end in one row (no padding; positions restart per
    sample, and each attends only within itself) instead of padding them to the longest.
    ``auto`` packs where the model's attention implementation is flash attention (its
    variable-length kernels run each sample on its own) and pads elsewhere: with ``sdpa`` or
    ``eager`` (the CPU) a packed row is attended over whole, masked, which costs more than the
    padding it saves. Both give the same loss and gradients."""
    shared_prefixes: Literal["auto", "on", "off"] = "auto"
    """Run the prefix that samples share (a group's prompt, and any tokens its completions begin
    with alike) once per micro-batch instead of once per sample: the samples of one prompt are
    laid out in one row, the prefix then each sample's rest, with an attention mask that lets each
    see only the prefix and itself. ``auto`` shares where the attention takes such a mask
    (``sdpa``, ``eager``) and micro-batches are not packed; flash attention cannot. Samples join
    one row only where that costs less: the masked attention over a row is computed whole, so long
    samples behind a short prompt stay apart. The same loss and gradients as without; fewer tokens
    go through the model (on the calculator tasks the prompt is a third of a sample)."""
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
    """Token budget of one micro-batch (padding included; packed: the samples' tokens)."""
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
    offload_states: bool = False
    """Colocated on GPUs only: after each published step move this rank's parameters and AdamW
    states to host memory while vLLM generates, and back for the next step (verl's and
    OpenRLHF's offload). The GPU then holds 16 bytes a parameter (over ``num_ranks``) less while
    generating, room for vLLM's KV cache (``generator.gpu_memory_utilization``); each step pays
    two host-device copies of those bytes (``learner_offload_s``, ``learner_reload_s``)."""
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


class AlgoConfig(Section):
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


class CriticConfig(Section):
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


class SftConfig(Section):
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


class LoraConfig(Section):
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
