"""PPO-clip policy loss with asymmetric clipping (clip-higher)."""

from __future__ import annotations

import torch


def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token PPO-clip loss, summed over masked tokens (the caller divides by its token count).

    With ``rho = exp(logprobs - old_logprobs)`` per token and advantage ``A`` (per token,
    usually the sample's advantage broadcast)::

        loss_t = -min(rho * A, clip(rho, 1 - clip_low, 1 + clip_high) * A)

    Returns ``(sum_t mask_t * loss_t, stats)``: ``stats`` holds the number of clipped tokens
    (``clipped``) and the sum of ``rho`` (``ratio_sum``) over masked tokens, both detached.
    All tensors share one shape; ``mask`` is 1 for tokens that count, 0 otherwise.
    """
    mask = mask.to(logprobs.dtype)
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    per_token = -torch.minimum(unclipped, clipped)
    loss = (per_token * mask).sum()
    stats = {
        "clipped": ((clipped < unclipped).to(mask.dtype) * mask).sum().detach(),
        "ratio_sum": (ratio * mask).sum().detach(),
    }
    return loss, stats
