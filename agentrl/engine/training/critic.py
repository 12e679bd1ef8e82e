"""Critic: one rank of an FSDP2 group that trains a value function for PPO with GAE.

The value model is a **separate model**: the trunk of a causal LM (its decoder, without the
output projection) plus a linear head giving one number per position, initialised at zero (every
value starts at 0, so the first advantages are the returns themselves). It is its own model, not a
head on the policy's trunk, so that the critic and the policy never share gradients or
optimizer state, the critic can be a different (smaller or larger) model, and its group trains
while the learner trains (the two run at the same time on their own ranks). By default it starts
from the policy's starting weights, as in verl and OpenRLHF.

The value of a token position is the value of the state *before* that token is written: the head
reads the hidden state of the previous position, exactly as the policy's log-prob of token ``t``
comes from position ``t - 1``. Only positions whose ``loss_mask`` is 1 (the model's own tokens,
the actions) get a value; the rest are the environment's (see :mod:`agentrl.algos.gae`).

Like :class:`~agentrl.engine.training.learner.Learner`, ``Critic`` is a plain class the run's
assembly (:mod:`agentrl.engine.assembly`) wraps as a Ray actor; every method that touches the
model is a collective of the critic's group (its own ``torch.distributed`` group, in its own
processes). A training sample is a dict with ``tokens``, ``loss_mask``, ``returns`` and
``values`` (per token: the GAE value targets and the values the critic gave before this batch's
first update).
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from agentrl.algos.value_loss import clipped_value_loss
from agentrl.engine.training.fsdp_rank import FsdpRank
from agentrl.engine.training import model_setup
from agentrl.engine.training.padded import PaddedBatch
from agentrl.errors import ConfigError, LearnerError

__all__ = ["Critic", "ValueModel"]


class ValueModel(torch.nn.Module):
    """A causal LM's decoder trunk and a zero-initialised linear value head."""

    def __init__(self, lm: Any) -> None:
        super().__init__()
        trunk = lm.get_decoder() if hasattr(lm, "get_decoder") else None
        if trunk is None:
            raise LearnerError(f"{type(lm).__name__} has no decoder trunk (get_decoder()); it cannot be a critic")
        self.trunk = trunk
        self.config = lm.config
        hidden = int(getattr(lm.config, "hidden_size", 0) or lm.get_input_embeddings().embedding_dim)
        self.head = torch.nn.Linear(hidden, 1)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, ids: torch.Tensor, attn: torch.Tensor, select: torch.Tensor) -> torch.Tensor:
        """Values of the positions ``select`` (``[B, T-1]``, about tokens ``1..T-1``), flat ``[N]``:
        the head applied to the hidden state of the position before each selected token."""
        hidden = self.trunk(input_ids=ids, attention_mask=attn).last_hidden_state[:, :-1]
        head_in = hidden[select].to(self.head.weight.dtype)  # bfloat16 under mixed precision
        return self.head(head_in).float().squeeze(-1).clone()  # not a view: FSDP's backward hook


class _ValueBatch(PaddedBatch):
    """One padded micro-batch of critic samples: :class:`PaddedBatch` plus each target's return
    and old value (zeros when ``with_targets`` is False)."""

    def __init__(self, rows: list[dict[str, Any]], pad_id: int, device: torch.device, with_targets: bool) -> None:
        super().__init__(rows, pad_id, device)
        self.returns = self.per_target(lambda r: r["returns"] if with_targets else None)
        self.old_values = self.per_target(lambda r: r["values"] if with_targets else None)


class Critic(FsdpRank):
    """One critic rank: an :class:`~agentrl.engine.training.fsdp_rank.FsdpRank` that trains the value
    model. Call ``setup()`` on every rank before anything else.

    Its keywords beside its own are :class:`~agentrl.engine.training.fsdp_rank.FsdpRank`'s (``rank_args``):
    ``model``: the folder or hub id whose trunk becomes the value model; ``lr``, ``betas``,
    ``weight_decay``, ``grad_clip``: AdamW and gradient clipping of the critic; ``value_clip``:
    :func:`~agentrl.algos.value_loss.clipped_value_loss`'s clip (None: plain squared error);
    ``updates_per_batch``: optimizer updates per batch (contiguous mini-batches);
    ``micro_batch_tokens``: padded tokens per forward pass; ``timeout_s``: the process group's
    collective timeout; ``dtype`` and ``activation_checkpointing``: as the learner's (the
    recipe's ``model.dtype``; bfloat16 is mixed precision on GPUs and CPUs, see
    :func:`~agentrl.engine.training.model_setup.mixed_precision`).
    """

    role = "critic"

    def __init__(
        self,
        *,
        value_clip: float | None = 0.2,
        dtype: str = "float32",
        activation_checkpointing: bool = False,
        **rank_args: Any,
    ) -> None:
        if value_clip is not None and value_clip <= 0:
            raise ConfigError(f"critic: value_clip must be > 0 or None, got {value_clip}")
        super().__init__(**rank_args)
        self.value_clip = value_clip
        self.dtype = getattr(torch, dtype)
        self.activation_checkpointing = activation_checkpointing
        self.model: ValueModel | Any = None

    def setup(self) -> dict[str, Any]:
        """Join the critic's process group, build and shard the value model (with more than one
        rank: on the meta device, broadcast from rank 0; in the learner's precision and with its
        activation checkpointing, :mod:`~agentrl.engine.training.model_setup`), build AdamW."""
        backend = self.join_group()
        mp = model_setup.mixed_precision(self.dtype, self.device)

        def make(lm: Any) -> ValueModel:
            model = ValueModel(lm)  # the output projection is dropped with lm
            model.config.use_cache = False
            if self.activation_checkpointing:
                model_setup.checkpoint_activations(model.trunk)
            return model

        with self.leave_group_on_failure():
            model = model_setup.load_sharded(
                self.model_name, rank=self.rank, world_size=self.world_size, device=self.device, dtype=torch.float32,
                make=make, role=self.role,
                shard=lambda m: self.shard(m, m.trunk, **({"mp_policy": mp} if mp is not None else {})),
            )
        self.model = model
        self.pad_id = int(getattr(model.config, "pad_token_id", None) or 0)
        self.build_optimizer()
        return {
            **self.identity(),
            "backend": backend,
            "parameters": sum(p.numel() for p in model.parameters()),
            "mixed_precision": str(self.dtype) if mp is not None else "off",
            "activation_checkpointing": self.activation_checkpointing,
        }

    # ------------------------------------------------------------------ FsdpRank's hooks
    def trained_module(self) -> Any:
        return self.model

    def make_batch(self, rows: list[dict[str, Any]], with_targets: bool) -> _ValueBatch:
        return _ValueBatch(rows, self.pad_id, self.device, with_targets)

    def stand_in_row(self) -> dict[str, Any]:
        return {"tokens": [self.pad_id] * 2, "loss_mask": [0, 1], "returns": [0.0, 0.0], "values": [0.0, 0.0]}

    def _check(self, samples: list[dict[str, Any]], with_targets: bool) -> None:
        keys = ("tokens", "loss_mask", "returns", "values") if with_targets else ("tokens", "loss_mask")
        for i, s in enumerate(samples):
            missing = [k for k in keys if k not in s]
            if missing:
                raise LearnerError(f"critic sample {i} lacks {missing}")
            n = len(s["tokens"])
            bad = [k for k in keys[1:] if len(s[k]) != n]
            if bad:
                raise LearnerError(f"critic sample {i}: {bad} differ in length from tokens ({n})")
            if n < 2:
                raise LearnerError(f"critic sample {i} has {n} token(s); need at least 2")

    def values(self, samples: list[dict[str, Any]]) -> list[list[float]]:
        """The value of every position whose ``loss_mask`` is 1 (0.0 elsewhere), laid out like
        ``tokens``: entry ``t`` is ``V(tokens[:t])``, the state before token ``t``. Collective;
        every rank returns the whole list."""
        self.require_setup()
        self._check(samples, with_targets=False)
        return self.per_row(samples, lambda batch: batch.pad(self.model(batch.ids, batch.attn, batch.select)))

    def train_step(self, samples: list[dict[str, Any]]) -> dict[str, float]:
        """``updates_per_batch`` AdamW updates of the clipped value loss on ``samples`` (every rank
        receives the same list). Returns, summed across ranks: ``value_loss`` (mean over the
        mini-batches), ``value_clip_fraction`` (action tokens where the clipped term bound),
        ``value_mse`` (mean squared error to the returns before the update, over action
        tokens), ``value_tokens``, ``value_grad_norm`` (last update), ``value_skipped_updates``
        (non-finite gradient norm), ``critic_s``."""
        self.require_setup()
        self._check(samples, with_targets=True)
        t0 = time.monotonic()
        self.model.train()
        acc = torch.zeros(4, dtype=torch.float64)  # loss, tokens, clipped, squared error
        minibatches = [[samples[i] for i in mb] for mb in self.minibatches(len(samples))]
        grad_norm, skipped = 0.0, 0
        for rows in minibatches:
            num_tokens = float(sum(sum(1 for m in s["loss_mask"][1:] if m) for s in rows))
            for _, batch, real in self.my_share(rows, self.plan(rows), True):
                v = batch.pad(self.model(batch.ids, batch.attn, batch.select))
                mask = batch.select.float()
                loss, stats = clipped_value_loss(v, batch.old_values, batch.returns, mask, self.value_clip, num_tokens)
                (loss * (self.world_size if real else 0.0)).backward()
                if real:
                    acc += torch.stack([
                        loss.detach().double() / len(minibatches), stats["tokens"].double(), stats["clipped"].double(),
                        stats["sq_error"].double(),
                    ]).cpu()
            grad_norm, finite = self.optimizer_update()
            skipped += int(not finite)
        self.step += 1
        if self.world_size > 1:
            dist.all_reduce(acc)
        tokens = max(1.0, acc[1].item())
        return {
            "value_loss": acc[0].item(),
            "value_clip_fraction": acc[2].item() / tokens,
            "value_mse": acc[3].item() / tokens,
            "value_tokens": acc[1].item(),
            "value_grad_norm": grad_norm,
            "value_skipped_updates": float(skipped),
            "critic_s": time.monotonic() - t0,
        }

    def save_checkpoint(self, out_dir: str, background: bool = False) -> str:
        """Save the value model and AdamW state (collective) into ``out_dir``, atomically:
        ``torch.distributed.checkpoint`` files, each rank's RNG state and
        ``trainer_state.json`` (step, ``kind = "critic"``). ``background``: as the learner's."""
        self.require_setup()
        return self.save_state(out_dir, self.model, {"kind": "critic"}, background=background)

    def load_checkpoint(self, checkpoint_dir: str) -> dict[str, Any]:
        """Restore what :meth:`save_checkpoint` wrote (collective, possibly another rank count)."""
        self.require_setup()
        return self.load_state(checkpoint_dir, self.model)
