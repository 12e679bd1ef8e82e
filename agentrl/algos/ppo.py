"""PPO-clip policy loss (Schulman et al., 2017) with asymmetric bounds (clip-higher, DAPO) and
dual clip (Ye et al., 2020)."""

from __future__ import annotations

import torch


def ppo_clip_token_loss(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token PPO-clip loss of an importance ratio ``rho`` (carrying the gradient)::

        loss_t = -min(rho_t * A_t, clip(rho_t, 1 - eps_low, 1 + eps_high) * A_t)
        dual clip (c > 1), for A_t < 0 only:   loss_t = min(loss_t, -c * A_t)

    ``eps_high > eps_low`` (clip-higher) lets unlikely tokens with positive advantage grow faster,
    which keeps entropy from collapsing. The dual clip bounds the loss of a negative-advantage
    token whose ratio exploded (a stale or unlucky sample) at ``c * |A|``.

    Returns ``(loss_t, clipped_t, dual_clipped_t)``: the per-token loss and two bool masks,
    where the clipped branch (no gradient) or the dual clip is active.
    """
    unclipped = -ratio * advantages
    clipped = -torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    loss = torch.maximum(unclipped, clipped)
    is_clipped = clipped > unclipped
    is_dual = torch.zeros_like(is_clipped)
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        bound = -dual_clip * advantages
        is_dual = (advantages < 0) & (loss > bound)
        loss = torch.where(is_dual, bound, loss)
    return loss, is_clipped & ~is_dual, is_dual


def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO-clip with ``rho = exp(logprobs - old_logprobs)``, summed over masked tokens.

    ``sum_t mask_t * loss_t`` with ``loss_t`` from :func:`ppo_clip_token_loss`; the caller
    divides by its token count. ``stats`` holds the number of clipped tokens (``clipped``) and
    the sum of ``rho`` (``ratio_sum``) over masked tokens, both detached.
    """
    mask = mask.to(logprobs.dtype)
    ratio = torch.exp(logprobs - old_logprobs)
    per_token, is_clipped, _ = ppo_clip_token_loss(
        ratio, advantages, clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip
    )
    stats = {
        "clipped": (is_clipped.to(mask.dtype) * mask).sum().detach(),
        "ratio_sum": (ratio * mask).sum().detach(),
    }
    return (per_token * mask).sum(), stats
