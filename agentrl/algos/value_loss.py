"""The critic's loss: squared error to the GAE returns, with PPO's value clipping.

Per action token ``t`` (``mask = 1``)::

    V_clip_t = V_old_t + clamp(V_t - V_old_t, -clip, clip)
    l_t      = 0.5 * max((V_t - R_t)^2, (V_clip_t - R_t)^2)

``V_old`` are the values the critic gave the batch before its first update on it (the ones GAE
used), ``R`` the returns. The clip keeps one batch from moving a value further than ``clip``
from where it was (PPO2's ``cliprange_value``; ``clip = None``: plain squared error). With one
update per batch ``V == V_old`` on the first pass, so the clip only binds on later mini-batches.
Aggregated as a mean over the action tokens (``num_tokens``: the whole batch's count when the
batch is split into micro-batches).
"""

from __future__ import annotations

import torch

__all__ = ["clipped_value_loss"]


def clipped_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float | None = 0.2,
    num_tokens: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``(loss, stats)`` for ``[B, T]`` tensors (see the module docstring).

    ``stats`` holds detached sums over the action tokens: ``tokens``, ``clipped`` (tokens where
    the clipped term was the larger), ``sq_error`` (of the unclipped ``(V - R)^2``).
    Example: ``V = 1.0, V_old = 0.5, R = 0.0, clip = 0.2``: unclipped ``1.0``, clipped value
    ``0.7`` gives ``0.49``; the loss is ``0.5 * max(1.0, 0.49) = 0.5``.
    """
    if clip is not None and clip <= 0:
        raise ValueError(f"value clip must be > 0 or None, got {clip}")
    m = mask.to(values.dtype)
    unclipped = (values - returns).pow(2)
    if clip is None:
        per_token = unclipped
        clipped = torch.zeros_like(m, dtype=torch.bool)
    else:
        v_clip = old_values + (values - old_values).clamp(-clip, clip)
        clipped_sq = (v_clip - returns).pow(2)
        per_token = torch.maximum(unclipped, clipped_sq)
        clipped = clipped_sq > unclipped
    denom = float(num_tokens) if num_tokens is not None else float(m.sum())
    loss = 0.5 * (per_token * m).sum() / max(1.0, denom)
    stats = {
        "tokens": m.sum().detach(),
        "clipped": (clipped.to(m.dtype) * m).sum().detach(),
        "sq_error": (unclipped.detach() * m).sum(),
    }
    return loss, stats
