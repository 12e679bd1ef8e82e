"""RLOO advantages (Ahmadian et al., 2024, "Back to Basics"): leave-one-out baseline."""

from __future__ import annotations

import torch

from agentrl.algos._groups import dense_group_index, group_count, group_mean


def rloo_advantages(rewards: torch.Tensor, group_index: torch.Tensor | None = None) -> torch.Tensor:
    """RLOO: ``A_i = r_i - (1/(n-1)) * sum_{j != i} r_j = n/(n-1) * (r_i - mean_g(r))``.

    The baseline of each sample is the mean reward of the *other* samples of its group, so it
    does not depend on the sample itself (unbiased). A group of one sample has no baseline and
    gets 0. Example ``r = (1, 0, 0, 0)``: ``A = (1, -1/3, -1/3, -1/3)``.
    """
    index, groups = dense_group_index(group_index, rewards.numel())
    n = group_count(index, groups, rewards.dtype)[index]
    scale = torch.where(n > 1, n / (n - 1).clamp_min(1), torch.zeros_like(n))
    return scale * (rewards - group_mean(rewards, index, groups))
