"""Token masking beyond a ratio band (IcePop-style, Ling team 2025; masked IS, Yao et al., 2025)."""

from __future__ import annotations

import torch


def ratio_band_mask(log_ratio: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """``keep_t = low <= exp(log_ratio_t) <= high`` (bool), with ``log_ratio = log pi_prox - log pi_behav``.

    Where learner and generator disagree by more than the band allows (a numeric blow-up, a
    token far off-policy), truncating the weight is not enough: the token is dropped from the
    loss altogether (it still counts in the normaliser, so the others are not up-weighted).
    Example band ``(0.5, 2)``: ratios ``(0.4, 1, 2, 2.5)`` give ``keep = (F, T, T, F)``.
    """
    if not 0 <= low <= 1 <= high:
        raise ValueError(f"ratio band must satisfy 0 <= low <= 1 <= high, got ({low}, {high})")
    ratio = torch.exp(log_ratio.detach())
    return (ratio >= low) & (ratio <= high)
