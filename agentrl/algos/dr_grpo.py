"""Dr. GRPO advantages (Liu et al., 2025, "Understanding R1-Zero-Like Training")."""

from __future__ import annotations

import torch

from agentrl.algos._groups import dense_group_index, group_mean


def dr_grpo_advantages(rewards: torch.Tensor, group_index: torch.Tensor | None = None) -> torch.Tensor:
    """Dr. GRPO: ``A_i = r_i - mean_g(r)`` (no division by the group's standard deviation).

    Dividing by the std up-weights groups that are nearly all right or all wrong (question-level
    difficulty bias); Dr. GRPO drops it. Its other half, no per-sequence length normalisation,
    is the loss aggregation ``seq-mean-token-sum`` (see :mod:`agentrl.algos.aggregation`).
    Example ``r = (1, 0, 0, 0)``: mean 0.25, ``A = (0.75, -0.25, -0.25, -0.25)``.
    """
    index, groups = dense_group_index(group_index, rewards.numel())
    return rewards - group_mean(rewards, index, groups)
