"""Learner: one rank of an FSDP2 data-parallel group that trains the policy.

``Learner`` is a plain class (one per process); the run's assembly (:mod:`agentrl.engine.assembly`)
wraps it as a Ray actor and the learner group calls every rank's method at the same time (they
run collectives together). The model is wrapped per decoder layer with
``torch.distributed.fsdp.fully_shard`` (with one rank on the CPU, a single unit around the
whole model: :func:`~agentrl.engine.training.fsdp_rank.per_layer_units`); the process group is
``gloo`` on CPU and ``nccl`` on GPU. The ``bfloat16`` dtype means mixed precision on both
(:mod:`~agentrl.engine.training.model_setup`); ``float16`` (which would need loss scaling) and
``float32`` train in float32 throughout.

A training sample is a dict with ``tokens``, ``loss_mask``, ``behaviour_logprobs`` (per token,
as in :class:`~agentrl.engine.common.trajectory.Trajectory`), ``advantage`` (one float for the whole
sample) or ``advantages`` (per token, laid out like ``tokens``: GAE with a critic) and optionally
``versions`` (per token: the weight version that sampled it; used for the mismatch metric).

One :meth:`Learner.train_step` per batch (one published weight version):

1. the batch is split into ``updates_per_batch`` mini-batches (one optimizer step each);
2. each mini-batch is planned into micro-batches of at most ``micro_batch_tokens`` padded
   tokens (:func:`~agentrl.engine.training.microbatch.plan_microbatches`, sorted by length so padding stays small); every rank
   computes the same plan and runs its share;
3. when asked (or needed: more than one update), the proximal log-probs are recomputed for the
   whole batch first, without gradient (decoupled PPO, see :mod:`agentrl.algos.objective`);
4. each micro-batch: a forward pass that computes chosen-token log-probs in chunks
   (:mod:`agentrl.engine.training.logprobs`), an optional frozen reference model's log-probs (KL term),
   :func:`agentrl.algos.policy_loss` normalised by the *mini-batch's* token/sequence counts,
   and a backward pass; FSDP reduces the gradients across ranks;
5. gradient clipping, AdamW, the LR schedule (:func:`lr_multiplier`).
"""

from __future__ import annotations

import functools
import math
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from agentrl.algos import STAT_KEYS, ObjectiveSettings, policy_loss
from agentrl.engine.common.audit import AuditLog, prompt_sha1
from agentrl.engine.training.fsdp_rank import FsdpRank
from agentrl.engine.training.lora import LoraSettings, apply_lora
from agentrl.engine.training import model_setup
from agentrl.engine.training.microbatch import PACKING, packs_microbatches
from agentrl.engine.training.padded import RLBatch
from agentrl.engine.training.shared_prefix import Sharing, key_cost, shares_prefixes
from agentrl.engine.training.step_clock import StepClock
from agentrl.engine.common.cluster import current_node_id
from agentrl.engine.common.run_dir import version_folder
from agentrl.engine.training.weight_export import WeightSender, full_state_dict, write_export
from agentrl.errors import ConfigError, LearnerError

__all__ = ["Learner", "lr_multiplier", "token_logprobs"]

LR_SCHEDULES = ("constant", "linear", "cosine")


def lr_multiplier(
    step: int, *, warmup_steps: int = 0, total_steps: int | None = None, schedule: str = "constant", min_lr_ratio: float = 0.0
) -> float:
    """Learning-rate factor of optimizer update ``step`` (0-based)::

        warm-up  (step < W):   (step + 1) / W
        then, with progress p = (step - W) / (S - W) clipped to [0, 1]:
          constant:  1
          linear:    m + (1 - m) * (1 - p)
          cosine:    m + (1 - m) * (1 + cos(pi * p)) / 2

    ``W = warmup_steps``, ``S = total_steps`` (required for ``linear``/``cosine``),
    ``m = min_lr_ratio``. Example ``W = 2, S = 6, cosine, m = 0``: factors for steps
    0..6 are ``0.5, 1, 1, 0.854, 0.5, 0.146, 0``.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    if total_steps is None:
        raise ValueError(f"lr schedule {schedule!r} needs total_steps")
    p = min(1.0, max(0.0, (step - warmup_steps) / max(1, total_steps - warmup_steps)))
    if schedule == "linear":
        return min_lr_ratio + (1.0 - min_lr_ratio) * (1.0 - p)
    if schedule == "cosine":
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * p))
    raise ValueError(f"unknown lr schedule {schedule!r}; expected one of {LR_SCHEDULES}")


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Log-probability of each target token: ``logits[t, target] - logsumexp(logits[t])``.

    ``logits`` is ``[B, T, V]`` and ``targets`` ``[B, T]``; the result is ``[B, T]`` in float32.
    A reference implementation over full logits; the learner itself uses
    :func:`agentrl.engine.training.logprobs.chunked_token_logprobs`, which never holds them.
    """
    logits = logits.float()
    chosen = torch.gather(logits, -1, targets.unsqueeze(-1)).squeeze(-1)
    return chosen - torch.logsumexp(logits, dim=-1)


class _AdapterOff:
    """The LoRA policy with its adapter disabled: the base model, as the KL reference."""

    def __init__(self, policy: Any, peft_model: Any) -> None:
        self.policy, self.peft = policy, peft_model

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.peft.disable_adapter():
            return self.policy(*args, **kwargs)

    def eval(self) -> None:
        return None


class Learner(FsdpRank):
    """One learner rank: an :class:`~agentrl.engine.training.fsdp_rank.FsdpRank` that trains the policy.
    Call ``setup()`` on every rank before anything else.

    Every method that touches the model is a collective: call it on every rank with the same
    arguments. Constructor arguments are plain values (:func:`agentrl.engine.wiring.learner_kwargs`
    maps the recipe's ``learner`` and ``algo`` sections onto them).
    """

    role = "learner"

    def __init__(
        self,
        *,
        dtype: str = "float32",
        warmup_steps: int = 0,
        lr_schedule: str = "constant",
        total_steps: int | None = None,
        min_lr_ratio: float = 0.0,
        logprob_chunk_tokens: int = 1024,
        activation_checkpointing: bool = False,
        pack_microbatches: str = "auto",
        shared_prefixes: str = "auto",
        attn_implementation: str | None = None,
        compute_entropy: bool = True,
        clip_low: float = 0.2,
        clip_high: float = 0.28,
        objective: ObjectiveSettings | None = None,
        proximal: str = "auto",
        reference_model: str | None = None,
        tokenizer: str | None = None,
        audit_path: str | None = None,
        temperature: float = 1.0,
        lora: dict[str, Any] | None = None,
        **rank_args: Any,
    ) -> None:
        """``rank_args``: the arguments every rank takes (``rank``, ``world_size``, ``master_addr``,
        ``master_port``, ``model``, ``lr``, ``betas``, ``weight_decay``, ``adam_eps``, ``grad_clip``,
        ``updates_per_batch``, ``micro_batch_tokens``, ``torch_threads``, ``timeout_s``, ``seed``:
        see :class:`~agentrl.engine.training.fsdp_rank.FsdpRank`).
        ``objective`` defaults to :class:`ObjectiveSettings` with ``clip_low``/``clip_high``.
        ``total_steps`` counts optimizer updates (``max_steps * updates_per_batch``).
        ``proximal``: ``auto`` recomputes the proximal log-probs exactly when a batch gets more
        than one update (with one update they equal the current log-probs, for free),
        ``recompute`` always, ``detached`` never. ``reference_model`` (default: ``model``) is
        loaded only when ``objective.kl_coef > 0``. ``tokenizer`` (default: ``model``) is the
        folder or hub id whose tokenizer goes into published folders and checkpoints: on a
        resume ``model`` is a checkpoint that may be pruned later, the tokenizer source is not.
        ``audit_path``: rank 0 appends one record per RL step to this append-only file (see
        :mod:`agentrl.engine.common.audit`): the samples it trained on, by ``id`` (an optional sample
        key) and prompt digest. ``lora``: train a LoRA adapter only (the fields of
        :class:`~agentrl.engine.training.lora.LoraSettings`); published versions are then adapter
        folders, and the KL reference is the model with the adapter disabled (no second model).
        ``temperature``: the generators' sampling temperature; the policy's
        (and the reference's) log-probs are those of the logits divided by it, the distribution
        the behaviour log-probs come from. ``pack_microbatches``: lay each micro-batch's samples end
        to end in one row instead of padding them (one of
        :data:`~agentrl.engine.training.microbatch.PACKING`; ``auto`` packs under flash attention).
        ``shared_prefixes``: samples that share a prompt run it once per micro-batch (one of
        :data:`~agentrl.engine.training.shared_prefix.SHARING`; ``auto`` where the attention takes
        a 4-D mask and micro-batches are not packed).
        ``attn_implementation``: transformers' attention implementation of the policy and the
        reference (None: its default, ``sdpa``)."""
        if lr_schedule not in LR_SCHEDULES:
            raise ConfigError(f"learner: lr_schedule must be one of {LR_SCHEDULES}, got {lr_schedule!r}")
        if lr_schedule != "constant" and not total_steps:
            raise ConfigError(f"learner: lr_schedule {lr_schedule!r} needs total_steps")
        if proximal not in ("auto", "recompute", "detached"):
            raise ConfigError(f"learner: proximal must be auto, recompute or detached, got {proximal!r}")
        if pack_microbatches not in PACKING:
            raise ConfigError(f"learner: pack_microbatches must be one of {PACKING}, got {pack_microbatches!r}")
        if not temperature > 0:
            raise ConfigError(f"learner: temperature must be positive (the rollout's sampling temperature), got {temperature}")
        if rank_args.get("updates_per_batch", 1) < 1 or rank_args.get("micro_batch_tokens", 1) < 1 or logprob_chunk_tokens < 1:
            raise ConfigError("learner: updates_per_batch, micro_batch_tokens and logprob_chunk_tokens must be >= 1")
        super().__init__(**rank_args)
        self.dtype = getattr(torch, dtype)
        self.schedule = functools.partial(
            lr_multiplier, warmup_steps=warmup_steps, total_steps=total_steps, schedule=lr_schedule, min_lr_ratio=min_lr_ratio
        )
        self.chunk_tokens = logprob_chunk_tokens
        self.activation_checkpointing, self.compute_entropy = activation_checkpointing, compute_entropy
        self.pack_microbatches, self.attn_implementation = pack_microbatches, attn_implementation
        self.shared_prefixes = shared_prefixes
        self.objective = objective if objective is not None else ObjectiveSettings(clip_low=clip_low, clip_high=clip_high)
        self.recompute_proximal = proximal == "recompute" or (proximal == "auto" and self.updates_per_batch > 1)
        self.reference_name = reference_model or self.model_name
        self.tokenizer_name = tokenizer or self.model_name
        self.audit = AuditLog(audit_path, fsync=True) if audit_path and self.rank == 0 else None
        self.sender: WeightSender | None = None
        """This rank's side of the weight-transfer group, once connected."""
        self.temperature = temperature
        self.policy: Any = None
        self.reference: Any = None
        self.lora = LoraSettings(**lora) if lora else None
        self.peft: Any = None
        """The peft model around the policy's LM (LoRA only)."""

    # ------------------------------------------------------------------ set-up
    def setup(self) -> dict[str, Any]:
        """Join the process group, load and shard the model (and the reference model when the
        objective has a KL term), build AdamW and the LR schedule. With more than one rank the
        models are built on the meta device and broadcast from rank 0
        (:func:`~agentrl.engine.training.model_setup.load_sharded`); the precision comes from
        :func:`~agentrl.engine.training.model_setup.mixed_precision`, as the critic's does."""
        from agentrl.engine.training.logprobs import PolicyModel

        backend = self.join_group()
        # bfloat16 on GPU: mixed precision. float16 would need loss scaling; it trains in float32.
        mp = model_setup.mixed_precision(self.dtype, self.device)
        mixed = mp is not None

        def build(name: str, trainable: bool) -> Any:
            peft: list[Any] = []

            def make(lm: Any) -> Any:
                lm.config.use_cache = False
                if trainable and self.lora is not None:
                    peft.append(apply_lora(lm, self.lora, name))  # lm now holds the adapter layers
                policy = PolicyModel(lm, self.temperature)
                if trainable and self.activation_checkpointing:
                    model_setup.checkpoint_activations(lm)
                if not trainable:
                    policy.requires_grad_(False)
                return policy

            def check(policy: Any) -> None:
                lm = policy.lm
                diff = policy.check_against_full_logits(int(lm.config.vocab_size))
                low = next(lm.parameters()).dtype != torch.float32
                if diff > (5e-2 if low else 1e-3):  # half precision: matmul tiling differs
                    raise LearnerError(
                        f"{name}: chunked log-probs differ from the model's own logits by {diff:.3g}; the model "
                        "transforms its logits after the output projection, which the learner does not support"
                    )

            # trained: float32 master weights, except a LoRA base, which is frozen; frozen models
            # (a LoRA base, the KL reference) stay in the compute dtype
            dtype = model_setup.frozen_dtype(mp) if (not trainable or self.lora is not None) else torch.float32
            policy = model_setup.load_sharded(
                name, rank=self.rank, world_size=self.world_size, device=self.device, dtype=dtype, make=make,
                check=check, role=self.role, attn_implementation=self.attn_implementation,
                shard=lambda m: self.shard(m, m.lm, **({"mp_policy": mp} if trainable and mp is not None else {})),
            )
            if peft:
                self.peft = peft[-1]  # the sharded model's (rank 0 also wrapped the model it loaded)
            return policy

        with self.leave_group_on_failure():  # a model or adapter that cannot be built
            self.policy = build(self.model_name, True)
            if self.objective.kl_coef > 0 and self.peft is not None:
                self.reference = _AdapterOff(self.policy, self.peft)  # the base model: the same weights, adapter off
            elif self.objective.kl_coef > 0:
                self.reference = build(self.reference_name, False)
                self.reference.eval()
        self.config = self.policy.lm.config
        attention = getattr(self.config, "_attn_implementation", None)
        self.packed = packs_microbatches(self.pack_microbatches, attention)
        with self.leave_group_on_failure():  # ConfigError: a setting it cannot have
            shares = shares_prefixes(self.shared_prefixes, attention, self.packed)
        self.sharing = Sharing(attention, self.dtype, self.micro_batch_tokens, key_cost(getattr(self.config, "hidden_size", None))) if shares else None
        self.generation_config = getattr(self.policy.lm, "generation_config", None)
        """The model's generation config (EOS ids of the chat template), written beside every
        published version, checkpoint and export."""
        self.vocab_size = int(self.config.vocab_size)
        self.pad_id = int(getattr(self.config, "pad_token_id", None) or 0)
        self.build_optimizer(self.schedule)
        n_params = sum(p.numel() for p in self.policy.parameters())
        return {
            **self.identity(),
            "backend": backend,
            "parameters": n_params,
            "trainable_parameters": sum(p.numel() for p in self.policy.parameters() if p.requires_grad),
            "lora": self.lora.as_dict() if self.lora is not None else None,
            "node_id": current_node_id(),
            "rendezvous": f"{self.master_addr}:{self.master_port}",
            "mixed_precision": str(self.dtype) if mixed else "off",
            "packed_microbatches": self.packed, "shared_prefixes": self.sharing is not None,
            "reference_model": self.reference is not None,
            "objective": self.objective.as_dict(),
        }

    # ------------------------------------------------------------------ FsdpRank's hooks
    def trained_module(self) -> Any:
        return self.policy

    def make_batch(self, rows: list[dict[str, Any]], with_targets: bool) -> RLBatch:
        return RLBatch(rows, self.pad_id, self.device, with_targets, self.packed, self.sharing)

    def stand_in_row(self) -> dict[str, Any]:
        return {"tokens": [self.pad_id] * 2, "loss_mask": [0, 1], "behaviour_logprobs": [0.0, 0.0], "advantage": 0.0}

    # ------------------------------------------------------------------ helpers
    def _check_samples(self, samples: list[dict[str, Any]], rl: bool) -> None:
        keys = ("tokens", "loss_mask", "behaviour_logprobs") if rl else ("tokens", "loss_mask")
        for i, s in enumerate(samples):
            missing = [k for k in keys if k not in s]
            if rl and "advantage" not in s and s.get("advantages") is None:
                missing.append("advantage")
            if missing:
                raise LearnerError(f"sample {i} lacks {missing}")
            n = len(s["tokens"])
            per_token = ["loss_mask"] + (["behaviour_logprobs"] if rl else []) + [
                k for k in ("versions", "advantages") if s.get(k) is not None
            ]
            bad = [k for k in per_token if len(s[k]) != n]
            if bad:
                raise LearnerError(f"sample {i}: {bad} differ in length from tokens ({n})")
            if n < 2:
                raise LearnerError(f"sample {i} has {n} token(s); need at least 2")
            if max(s["tokens"]) >= self.vocab_size or min(s["tokens"]) < 0:
                raise LearnerError(f"sample {i} holds a token id outside the vocabulary (0..{self.vocab_size - 1})")

    def _forward(self, model: Any, batch: RLBatch, with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Flat log-probs (and entropies) of the selected positions of ``batch``."""
        return model(batch.ids, batch.attn, batch.model_select, self.chunk_tokens, with_entropy, batch.position_ids,
                     batch.hidden_index, batch.targets)

    # ------------------------------------------------------------------ training
    def train_step(self, samples: list[dict[str, Any]]) -> dict[str, float]:
        """One batch of RL training (every rank receives the same list): ``updates_per_batch``
        optimizer updates of :func:`agentrl.algos.policy_loss` with the learner's
        :class:`ObjectiveSettings`. Returns metrics summed (then normalised) across ranks:

        ``loss``, ``clip_fraction``, ``dual_clip_fraction``, ``ratio_mean``, ``is_weight_mean``,
        ``is_truncated_fraction``, ``band_masked_fraction``, ``kl_ref`` (mean KL estimate to the
        reference model; 0 without one), ``entropy`` (mean over trained tokens),
        ``logprob_abs_diff`` (mean ``|log pi_learner - log pi_behav|`` over trained tokens:
        staleness plus numeric mismatch), ``logprob_abs_diff_current`` (the same over tokens
        sampled by the weights this learner holds: numeric mismatch alone; needs ``versions``),
        ``current_version_tokens``, ``trained_tokens``, ``padding_fraction`` (padded slots over
        all slots of the micro-batches), ``grad_norm`` (of the last update), ``skipped_updates``
        (non-finite gradient norm), ``lr``, ``step``, ``updates``, ``train_s``, and
        ``step_<part>_s`` for each part of :attr:`StepClock.PARTS` (plan, pad, proximal,
        forward_backward, stats, optimizer): where this rank's ``train_s`` went.
        """
        self.require_setup()
        reload_s = self.reload_states()  # offloaded while vLLM generated (colocated on GPUs)
        self._check_samples(samples, rl=True)
        t0 = time.monotonic()
        version = self.step
        names = list(STAT_KEYS) + ["loss", "entropy", "abs_diff", "abs_diff_cur", "cur_tokens", "real", "slots"]
        acc = torch.zeros(len(names), dtype=torch.float64)
        at = {k: i for i, k in enumerate(names)}
        grad_norm, skipped = 0.0, 0
        minibatches = [[samples[i] for i in mb] for mb in self.minibatches(len(samples))]
        plans = [self.plan(rows) for rows in minibatches]
        clock = StepClock(t0)
        clock.lap("plan")
        proximal: dict[tuple[int, int], torch.Tensor] = {}
        if self.recompute_proximal and samples:
            self.policy.eval()
            with torch.no_grad():
                for u, (rows_of, plan) in enumerate(zip(minibatches, plans)):
                    for k, (_, batch, real) in enumerate(self.my_share(rows_of, plan, True)):
                        lp = batch.pad(self._forward(self.policy, batch)[0])
                        if real:
                            proximal[(u, k)] = lp
            clock.lap("proximal")
        self.policy.train()
        for u, (rows_of, plan) in enumerate(zip(minibatches, plans)):
            num_tokens = float(sum(sum(1 for m in s["loss_mask"][1:] if m) for s in rows_of))
            num_seqs = float(sum(1 for s in rows_of if any(s["loss_mask"][1:])))
            clock.lap("plan")
            for k, (_, batch, real) in enumerate(self.my_share(rows_of, plan, True)):
                clock.lap("pad")  # the micro-batch's tensors, built as my_share yields it
                lp_flat, ent_flat = self._forward(self.policy, batch, with_entropy=self.compute_entropy)
                lp = batch.pad(lp_flat)
                ref = None
                if self.reference is not None:
                    with torch.no_grad():
                        ref = batch.pad(self._forward(self.reference, batch)[0])
                mask = batch.select.float()
                loss, stats = policy_loss(
                    lp, batch.behaviour, batch.advantages, mask, self.objective,
                    proximal_logprobs=proximal.get((u, k)), ref_logprobs=ref, num_tokens=num_tokens, num_seqs=num_seqs,
                )
                (loss * (self.world_size if real else 0.0)).backward()
                clock.lap("forward_backward")
                if not real:
                    continue
                with torch.no_grad():
                    diff = (lp.detach() - batch.behaviour).abs() * mask
                    cur = mask * (batch.versions == version).float()
                    extra = torch.stack([
                        loss.detach().double() / len(minibatches),
                        ent_flat.sum().double() if ent_flat is not None else torch.zeros((), dtype=torch.float64),
                        diff.sum().double(),
                        (diff * cur).sum().double(),
                        cur.sum().double(),
                    ]).cpu()
                acc[: len(STAT_KEYS)] += torch.stack([stats[key].double() for key in STAT_KEYS]).cpu()
                acc[at["loss"] : at["real"]] += extra
                acc[at["real"]] += batch.real_tokens
                acc[at["slots"]] += batch.slots
                clock.lap("stats")
            grad_norm, finite = self.optimizer_update()
            clock.lap("optimizer")
            skipped += int(not finite)
        self.step += 1
        if self.audit is not None:
            self.audit.append({"step": self.step, "samples": [
                {"id": s.get("id"), "prompt_sha1": prompt_sha1(s["tokens"], s["loss_mask"]), "tokens": len(s["tokens"])}
                for s in samples]})
        if self.world_size > 1:
            dist.all_reduce(acc)
        clock.lap("stats")
        tok = max(1.0, acc[at["tokens"]].item())
        cur_tok = acc[at["cur_tokens"]].item()
        return {
            "loss": acc[at["loss"]].item(),
            "clip_fraction": acc[at["clipped"]].item() / tok,
            "dual_clip_fraction": acc[at["dual_clipped"]].item() / tok,
            "ratio_mean": acc[at["ratio_sum"]].item() / tok,
            "is_weight_mean": acc[at["is_weight_sum"]].item() / tok,
            "is_truncated_fraction": acc[at["is_truncated"]].item() / tok,
            "band_masked_fraction": acc[at["band_masked"]].item() / tok,
            "kl_ref": acc[at["kl_sum"]].item() / tok,
            "entropy": acc[at["entropy"]].item() / tok,
            "logprob_abs_diff": acc[at["abs_diff"]].item() / tok,
            "logprob_abs_diff_current": acc[at["abs_diff_cur"]].item() / max(1.0, cur_tok),
            "current_version_tokens": cur_tok,
            "trained_tokens": acc[at["tokens"]].item(),
            "padding_fraction": 1.0 - acc[at["real"]].item() / max(1.0, acc[at["slots"]].item()),
            "grad_norm": grad_norm,
            "skipped_updates": float(skipped),
            "lr": self.scheduler.get_last_lr()[0],
            "step": float(self.step),
            "updates": float(self.updates),
            "train_s": time.monotonic() - t0,
            **clock.seconds(),
            **({"learner_reload_s": reload_s} if reload_s else {}),
        }

    def hold_step(self) -> dict[str, float]:
        """Advance the version without touching the weights (a critic's warm-up step: the same
        weights are published under the next version). Collective only in name: no
        communication. Returns the metrics of :meth:`train_step` that still mean something."""
        self.require_setup()
        self.step += 1
        return {"trained_tokens": 0.0, "updates": float(self.updates), "lr": self.scheduler.get_last_lr()[0],
                "step": float(self.step), "train_s": 0.0, "policy_held": 1.0}

    def sft_step(self, samples: list[dict[str, Any]]) -> dict[str, float]:
        """One supervised optimizer step: mean negative log-likelihood of the tokens whose
        ``loss_mask`` is 1 (assistant tokens), over the whole batch. ``samples`` need only
        ``tokens`` and ``loss_mask``. Returns metrics summed across ranks."""
        self.require_setup()
        self.reload_states()
        self._check_samples(samples, rl=False)
        t0 = time.monotonic()
        self.policy.train()
        total_tokens = sum(sum(1 for m in s["loss_mask"][1:] if m) for s in samples)
        scale = self.world_size / max(1, total_tokens)
        acc = torch.zeros(5, dtype=torch.float64)  # nll sum, tokens, p > 1/2 tokens, real tokens, slots
        for _, batch, real in self.my_share(samples, self.plan(samples), False):
            lp, _ = self._forward(self.policy, batch)
            nll = -lp.sum()
            (nll * (scale if real else 0.0)).backward()
            if not real:
                continue
            acc += torch.tensor(
                [nll.item(), lp.numel(), (lp.detach() > -0.6931).sum().item(), batch.real_tokens, batch.slots],
                dtype=torch.float64,
            )
        grad_norm, _ = self.optimizer_update()
        self.step += 1
        if self.world_size > 1:
            dist.all_reduce(acc)
        tokens = max(1.0, acc[1].item())
        return {
            "sft_loss": acc[0].item() / tokens,
            "sft_token_p_gt_half": acc[2].item() / tokens,
            "trained_tokens": acc[1].item(),
            "padding_fraction": 1.0 - acc[3].item() / max(1.0, acc[4].item()),
            "grad_norm": grad_norm,
            "lr": self.scheduler.get_last_lr()[0],
            "train_s": time.monotonic() - t0,
        }

    def compute_logprobs(self, samples: list[dict[str, Any]]) -> list[list[float]]:
        """The learner's log-prob of every token whose ``loss_mask`` is 1 (0.0 elsewhere), laid
        out like ``behaviour_logprobs``: entry ``t`` is ``log pi(tokens[t] | tokens[:t])``.
        Collective; every rank returns the whole list. No gradient, no update."""
        self.require_setup()
        self._check_samples(samples, rl=False)
        with self.states_on_device():
            return self.per_row(samples, lambda batch: batch.pad(self._forward(self.policy, batch)[0]))

    # ------------------------------------------------------------------ weights
    def full_state_dict(self, dtype: torch.dtype | None = None, adapter_only: bool = False) -> dict[str, torch.Tensor]:
        """The policy's unsharded parameters on rank 0 (collective; an empty dict elsewhere):
        :func:`~agentrl.engine.training.weight_export.full_state_dict` of the policy's LM."""
        self.require_setup()
        with self.states_on_device():
            return full_state_dict(self.policy.lm, self.rank, dtype, adapter_only)

    def publish(self, out_dir: str, with_tokenizer: bool = False, serving_dtype: bool = False, merged: bool = False) -> str | None:
        """Write the current weights as a Hugging Face folder at ``out_dir`` (collective; rank 0
        writes, atomically). ``serving_dtype``: in the generators' dtype (the recipe's
        ``model.dtype``) rather than the float32 master weights, for weight versions only the
        generators read. With LoRA the folder is the adapter alone (a peft folder, megabytes),
        unless ``merged``: then the base model with the adapter merged in. Returns the path on
        rank 0, ``None`` elsewhere."""
        dtype = self.dtype if serving_dtype else None
        sd = self.full_state_dict(dtype, adapter_only=self.lora is not None and not merged)
        if self.rank != 0:
            return None
        tokenizer = None
        if with_tokenizer and (self.lora is None or merged):
            from agentrl.models.loading import load_tokenizer

            tokenizer = load_tokenizer(self.tokenizer_name)
        return write_export(sd, out_dir, config=self.config, base_model=self.model_name, lora=self.lora, merged=merged,
                            tokenizer=tokenizer, generation_config=self.generation_config, dtype=dtype)

    def publish_version(self, weights_dir: str) -> int:
        """Write the current weights to ``weights_dir/v<step>`` (collective) and return that
        version, the number of RL steps trained: one call, so the label always fits the weights."""
        self.publish(str(version_folder(weights_dir, self.step)), serving_dtype=True)
        return self.step

    def weight_transfer_endpoint(self) -> tuple[str, int]:
        """This rank's address and a free port: where the weight-transfer group meets."""
        from agentrl.engine.generation.weight_transfer import free_endpoint

        return free_endpoint()

    def connect_weight_transfer(
        self, backend: str, address: str, port: int, world_size: int, generators: list[Any], timeout_s: float, wire_dtype: str
    ) -> None:
        """Form the weight-transfer group with the generator actors (collective over the learner
        ranks; :class:`~agentrl.engine.training.weight_export.WeightSender`). ``world_size`` = 1 + the
        generators' vLLM workers."""
        self.require_setup()
        self.sender = WeightSender(self.rank, self.device)
        self.sender.connect(backend, address, port, world_size, generators, timeout_s, self.policy.lm, wire_dtype)

    def send_weights(self, version: int) -> float:
        """Broadcast the current parameters to the generators as ``version`` (collective over
        the learner ranks). Returns the seconds it took."""
        if self.sender is None:
            from agentrl.errors import WeightSyncError

            raise WeightSyncError("no weight-transfer group: call connect_weight_transfer first")
        with self.states_on_device():
            return self.sender.send(version)

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, out_dir: str, background: bool = False) -> str:
        """Save everything needed to resume (collective): the sharded model and AdamW state with
        ``torch.distributed.checkpoint``, the step and LR-schedule state, each rank's RNG state
        and the model config (+ tokenizer) for export. See :mod:`agentrl.engine.training.checkpoint` for
        the layout. The folder appears atomically; an existing one is replaced. ``background``:
        the sharded state is written by a thread and the folder appears at
        :meth:`finish_checkpoint` (:meth:`FsdpRank.save_state`)."""

        def export_files(tmp: Path) -> None:
            self.config.save_pretrained(tmp / "hf")
            if self.generation_config is not None:
                self.generation_config.save_pretrained(tmp / "hf")
            try:
                from agentrl.models.loading import load_tokenizer

                load_tokenizer(self.tokenizer_name).save_pretrained(tmp / "hf")
            except Exception:  # a model without a tokenizer still exports
                pass

        self.require_setup()
        state = {
            "dtype": str(self.dtype).removeprefix("torch."),
            "objective": self.objective.as_dict(),
            "lora": self.lora.as_dict() if self.lora is not None else None,
        }
        with self.states_on_device():
            return self.save_state(out_dir, self.policy.lm, state, export_files, background=background)

    def load_checkpoint(self, checkpoint_dir: str) -> dict[str, Any]:
        """Restore a checkpoint written by :meth:`save_checkpoint` (collective), possibly by a
        different number of ranks (the model and optimizer state are re-sharded; each rank's
        RNG state is restored when the checkpoint has one for its rank). Returns the
        trainer state (``step``, ``updates``, ...)."""
        self.require_setup()
        return self.load_state(checkpoint_dir, self.policy.lm)
