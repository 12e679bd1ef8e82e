"""GSPO (Zheng et al., 2025, "Group Sequence Policy Optimization"): a sequence-level ratio."""

from __future__ import annotations

import torch


def sequence_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``(1/|y_i|) * sum_t mask_it * values_it`` per row, ``[B]`` (0 for a row without tokens)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum(-1) / mask.sum(-1).clamp_min(1.0)


def gspo_ratio(logprobs: torch.Tensor, anchor_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO's length-normalised sequence ratio, in its token form (``[B, T]``)::

        s_i    = exp( (1/|y_i|) * sum_t (log pi_theta(y_it) - log pi_anchor(y_it)) )
        s_it   = sg[s_i] * exp(log pi_theta(y_it) - sg[log pi_theta(y_it)])

    Every token of sequence ``i`` holds the value ``s_i``; the gradient of ``s_it`` is
    ``s_i * grad log pi_theta(y_it)``, so averaging ``s_it * A_i`` over the sequence's tokens
    (aggregation ``seq-mean-token-mean``) gives exactly GSPO's sequence-level gradient
    ``A_i * grad s_i``, and clipping ``s_it`` clips whole sequences. GSPO's clip range is far
    narrower than PPO's (the paper uses ``eps_low = 3e-4, eps_high = 4e-4``).
    """
    log_s = sequence_mean(logprobs.detach() - anchor_logprobs, mask)
    return torch.exp(log_s).unsqueeze(-1) * torch.exp(logprobs - logprobs.detach())
