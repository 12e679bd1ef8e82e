"""Truncated importance sampling against the behaviour policy (Yao et al., 2025; Ionides, 2008)."""

from __future__ import annotations

import torch


def truncated_is_weight(log_ratio: torch.Tensor, cap: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``w = min(exp(log_ratio), C)``, detached; ``log_ratio = log pi_prox - log pi_behav``.

    Tokens are sampled by the generator (``pi_behav``: older weights, and another numeric
    implementation) but the gradient is for the learner's policy; ``w`` re-weights each token
    toward the learner. Capping at ``C`` bounds the variance (at the price of a small bias):
    a token the learner finds far likelier than the generator did cannot dominate the batch.
    ``cap = None`` leaves ``w`` untruncated. Returns ``(w, truncated)`` where ``truncated`` is
    the bool mask of tokens whose raw weight exceeded ``C``. Example ``C = 2``: log-ratios
    ``(0, log 1.5, log 3)`` give ``w = (1, 1.5, 2)``.
    """
    w = torch.exp(log_ratio.detach())
    if cap is None:
        return w, torch.zeros_like(w, dtype=torch.bool)
    if cap <= 0:
        raise ValueError(f"importance-weight cap must be > 0, got {cap}")
    return w.clamp(max=cap), w > cap
