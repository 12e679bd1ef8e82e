"""The one entry point the learner calls: :func:`policy_loss` with :class:`ObjectiveSettings`.

It composes the pieces of this package (each a small pure function in its own file) into the
loss of one micro-batch. Three log-probabilities of each sampled token take part:

- ``pi_theta``: the learner's current policy (carries the gradient),
- ``pi_prox``: the *proximal* policy, the learner's weights when the batch arrived (recomputed
  by a forward pass without gradient, or simply ``pi_theta`` detached when the batch gets one
  optimizer step, which is the same value at no cost),
- ``pi_behav``: the behaviour policy, the generator (vLLM) that sampled the token, possibly
  some weight versions older and computed by other kernels.

The per-token loss is::

    anchor = pi_prox  (off_policy = "decoupled")   |   pi_behav  (off_policy = "behaviour")
    r_t    = pi_theta / anchor                      (GSPO: the sequence ratio s_i, see gspo.py)
    w_t    = min(pi_prox / pi_behav, is_cap)        (decoupled only; GSPO: per sequence)
    keep_t = ratio_band[0] <= pi_prox / pi_behav <= ratio_band[1]   (when a band is set)
    l_t    = keep_t * w_t * ppo_clip(r_t, A_t)  +  kl_coef * KL_t(pi_theta || pi_ref)

aggregated over the trained tokens by ``loss_agg`` (see aggregation.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from agentrl.algos.aggregation import AGGREGATION_MODES, aggregate_loss
from agentrl.algos.decoupled import decoupled_ppo_token_loss
from agentrl.algos.gspo import gspo_ratio, sequence_mean
from agentrl.algos.kl import kl_penalty
from agentrl.algos.ppo import ppo_clip_token_loss
from agentrl.algos.ratio_mask import ratio_band_mask
from agentrl.algos.tis import truncated_is_weight

__all__ = ["ObjectiveSettings", "policy_loss", "STAT_KEYS"]

STAT_KEYS: tuple[str, ...] = (
    "tokens", "clipped", "dual_clipped", "ratio_sum", "is_weight_sum", "is_truncated", "band_masked", "kl_sum"
)
"""Keys of the stats :func:`policy_loss` returns: sums over the micro-batch's trained tokens."""


@dataclass(frozen=True)
class ObjectiveSettings:
    """What loss to optimise: plain values, picklable, validated on construction.

    The defaults, and why:

    - ``policy_loss = "ppo"`` with ``clip_low = 0.2, clip_high = 0.28``: PPO-clip with DAPO's
      clip-higher, the common choice for reasoning RL; the higher upper bound keeps entropy up.
    - ``dual_clip = 3.0``: only acts on negative-advantage tokens whose ratio exceeds 3, where it
      bounds the loss; such tokens come from stale or numerically divergent samples (verl's value).
    - ``off_policy = "decoupled"``: asynchronous training trains on tokens up to
      ``max_staleness`` versions old. Measuring the trust region from the behaviour policy
      would clip (silence) exactly the stale tokens for reasons unrelated to this update;
      decoupled PPO measures it from the learner's own weights and corrects the staleness with
      an importance weight instead (AReaL).
    - ``is_cap = 2.0``: truncated importance sampling bounds that weight, trading a little bias
      for bounded variance; 2 is the value Yao et al. and verl use for generator/learner mismatch.
    - ``ratio_band = None``: no masking. With float32 on both sides the mismatch is ~1e-5, so a
      band would mask nothing; set e.g. ``(0.5, 2.0)`` for bf16/fp8 generators or MoE models.
    - ``loss_agg = "token-mean"``: every trained token weighs the same, so long (multi-turn)
      episodes are not down-weighted per token (DAPO).
    - ``kl_coef = 0.0``: no reference model (saves its memory and forward pass; DAPO and
      Dr. GRPO drop the KL term for verifiable rewards). ``kl_estimator = "k3"`` when enabled.
    """

    policy_loss: str = "ppo"
    """``ppo`` (token ratio) or ``gspo`` (sequence ratio; use GSPO's narrow clip range)."""
    clip_low: float = 0.2
    """Ratios below ``1 - clip_low`` stop contributing (negative advantages)."""
    clip_high: float = 0.28
    """Ratios above ``1 + clip_high`` stop contributing (positive advantages; clip-higher when > ``clip_low``)."""
    dual_clip: float | None = 3.0
    """Dual-clip constant ``c > 1`` for negative advantages; ``None`` disables it."""
    off_policy: str = "decoupled"
    """``decoupled`` (clip around ``pi_prox``, importance weight ``pi_prox/pi_behav``) or
    ``behaviour`` (classic PPO: clip around ``pi_behav``, no separate weight)."""
    is_cap: float | None = 2.0
    """Cap ``C`` of the importance weight ``pi_prox/pi_behav`` (decoupled only); ``None`` = no cap."""
    ratio_band: tuple[float, float] | None = None
    """Drop tokens whose ``pi_prox/pi_behav`` lies outside ``[low, high]``; ``None`` = keep all."""
    loss_agg: str = "token-mean"
    """``token-mean``, ``seq-mean-token-sum`` or ``seq-mean-token-mean``."""
    kl_coef: float = 0.0
    """Weight of the KL penalty against the frozen reference model; 0 = no reference model."""
    kl_estimator: str = "k3"
    """``k1``, ``k2`` or ``k3`` (see kl.py)."""

    def __post_init__(self) -> None:
        if self.policy_loss not in ("ppo", "gspo"):
            raise ValueError(f"policy_loss must be 'ppo' or 'gspo', got {self.policy_loss!r}")
        if self.off_policy not in ("decoupled", "behaviour"):
            raise ValueError(f"off_policy must be 'decoupled' or 'behaviour', got {self.off_policy!r}")
        if self.loss_agg not in AGGREGATION_MODES:
            raise ValueError(f"loss_agg must be one of {AGGREGATION_MODES}, got {self.loss_agg!r}")
        if self.kl_estimator not in ("k1", "k2", "k3"):
            raise ValueError(f"kl_estimator must be k1, k2 or k3, got {self.kl_estimator!r}")
        if not (0 <= self.clip_low < 1 and self.clip_high >= 0):
            raise ValueError(f"need 0 <= clip_low < 1 and clip_high >= 0, got ({self.clip_low}, {self.clip_high})")
        if self.dual_clip is not None and self.dual_clip <= 1:
            raise ValueError(f"dual_clip must be > 1 or None, got {self.dual_clip}")
        if self.is_cap is not None and self.is_cap <= 0:
            raise ValueError(f"is_cap must be > 0 or None, got {self.is_cap}")
        if self.ratio_band is not None:
            low, high = self.ratio_band
            if not 0 <= low <= 1 <= high:
                raise ValueError(f"ratio_band must satisfy 0 <= low <= 1 <= high, got {self.ratio_band}")
        if self.kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got {self.kl_coef}")

    def as_dict(self) -> dict[str, Any]:
        """The settings as a plain dict (for logs)."""
        return asdict(self)


def policy_loss(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    settings: ObjectiveSettings = ObjectiveSettings(),
    *,
    proximal_logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Loss of one micro-batch (see the module docstring for the formula).

    All per-token tensors are ``[B, T]``; ``advantages`` may also be ``[B]`` (one per sequence).
    ``mask`` is 1 on trained tokens. ``proximal_logprobs`` defaults to ``logprobs`` detached;
    ``ref_logprobs`` is required when ``settings.kl_coef > 0``. ``num_tokens``/``num_seqs`` are
    the whole batch's counts when the batch is split into micro-batches (see
    :func:`~agentrl.algos.aggregation.aggregate_loss`).

    Returns ``(loss, stats)``; ``stats`` maps each of :data:`STAT_KEYS` to a detached sum over
    the trained tokens (``is_weight_sum``: of ``w_t``; ``ratio_sum``: of ``r_t``; counts for the
    others), so that a learner can add them up across micro-batches and ranks.
    """
    s = settings
    m = mask.to(logprobs.dtype)
    if advantages.dim() == logprobs.dim() - 1:
        advantages = advantages.unsqueeze(-1)
    advantages = advantages.to(logprobs.dtype).expand_as(logprobs)
    prox = logprobs.detach() if proximal_logprobs is None else proximal_logprobs.detach()
    log_w = prox - behaviour_logprobs  # log pi_prox / pi_behav, per token
    zeros = torch.zeros_like(m, dtype=torch.bool)

    if s.policy_loss == "gspo":
        anchor = prox if s.off_policy == "decoupled" else behaviour_logprobs
        ratio = gspo_ratio(logprobs, anchor, m)
        log_w = sequence_mean(log_w, m).unsqueeze(-1).expand_as(logprobs)  # one weight per sequence
        per_token, clipped, dual = ppo_clip_token_loss(ratio, advantages, clip_low=s.clip_low, clip_high=s.clip_high, dual_clip=s.dual_clip)
        if s.off_policy == "decoupled":
            w, truncated = truncated_is_weight(log_w, s.is_cap)
            per_token = w * per_token
        else:
            w, truncated = torch.ones_like(per_token), zeros
        ratio = ratio.detach()
    elif s.off_policy == "decoupled":
        per_token, parts = decoupled_ppo_token_loss(
            logprobs, prox, behaviour_logprobs, advantages,
            clip_low=s.clip_low, clip_high=s.clip_high, dual_clip=s.dual_clip, is_cap=s.is_cap,
        )
        clipped, dual, truncated, w, ratio = parts["clipped"], parts["dual_clipped"], parts["truncated"], parts["w"], parts["ratio"]
    else:
        ratio = torch.exp(logprobs - behaviour_logprobs)
        per_token, clipped, dual = ppo_clip_token_loss(ratio, advantages, clip_low=s.clip_low, clip_high=s.clip_high, dual_clip=s.dual_clip)
        w, truncated, ratio = torch.ones_like(per_token), zeros, ratio.detach()

    keep = ratio_band_mask(log_w, *s.ratio_band) if s.ratio_band is not None else ~zeros
    per_token = per_token * keep.to(per_token.dtype)
    kl = torch.zeros_like(per_token)
    if s.kl_coef > 0:
        if ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs (the frozen reference model's log-probs)")
        kl = kl_penalty(logprobs, ref_logprobs, s.kl_estimator)
        per_token = per_token + s.kl_coef * kl
    loss = aggregate_loss(per_token, m, s.loss_agg, num_tokens=num_tokens, num_seqs=num_seqs)

    def total(x: torch.Tensor) -> torch.Tensor:
        return (x.detach().to(m.dtype) * m).sum()

    stats = {
        "tokens": m.sum().detach(),
        "clipped": total(clipped),
        "dual_clipped": total(dual),
        "ratio_sum": total(ratio),
        "is_weight_sum": total(w),
        "is_truncated": total(truncated),
        "band_masked": total(~keep),
        "kl_sum": total(kl),
    }
    return loss, stats
