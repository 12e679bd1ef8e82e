"""Decoupled PPO (Hilton et al., 2022, "Batch size-invariance for policy optimization"; AReaL).

In asynchronous RL the policy that sampled a token (behaviour, ``pi_behav``) is not the one the
trust region should be measured from. Decoupled PPO separates the two: the clip is taken
around a *proximal* policy ``pi_prox`` (the learner's own weights before this update), and
the off-policyness between behaviour and proximal policy is corrected by an importance weight.
"""

from __future__ import annotations

import torch

from agentrl.algos.ppo import ppo_clip_token_loss
from agentrl.algos.tis import truncated_is_weight


def decoupled_ppo_token_loss(
    logprobs: torch.Tensor,
    proximal_logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    dual_clip: float | None = None,
    is_cap: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token decoupled PPO loss::

        r_t    = pi_theta(y_t) / pi_prox(y_t)                    (carries the gradient)
        w_t    = min(pi_prox(y_t) / pi_behav(y_t), C)            (a constant)
        loss_t = -w_t * min(r_t * A_t, clip(r_t, 1 - eps_low, 1 + eps_high) * A_t)

    (dual clip as in :func:`~agentrl.algos.ppo.ppo_clip_token_loss`). With ``pi_prox`` equal to
    the current weights (one optimizer step per batch), ``r_t = 1`` and the gradient is the
    truncated-importance-weighted policy gradient ``-w_t * A_t * grad log pi_theta(y_t)``.

    Returns ``(loss_t, parts)``; ``parts`` holds the bool masks ``clipped``, ``dual_clipped``,
    ``truncated`` and the weight ``w`` (all detached, per token).
    """
    ratio = torch.exp(logprobs - proximal_logprobs.detach())
    loss, clipped, dual = ppo_clip_token_loss(ratio, advantages, clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip)
    w, truncated = truncated_is_weight(proximal_logprobs - behaviour_logprobs, is_cap)
    return w * loss, {"clipped": clipped, "dual_clipped": dual, "truncated": truncated, "w": w, "ratio": ratio.detach()}
