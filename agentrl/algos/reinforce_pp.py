"""REINFORCE++ advantages (Hu, 2025): normalised over the whole batch, not per group."""

from __future__ import annotations

import torch

from agentrl.algos._groups import dense_group_index, group_mean


def reinforce_pp_advantages(
    rewards: torch.Tensor,
    group_index: torch.Tensor | None = None,
    *,
    subtract_group_mean: bool = False,
    eps: float = 1e-6,
) -> torch.Tensor:
    """REINFORCE++: ``A_i = (x_i - mean_B(x)) / (std_B(x) + eps)`` over the whole batch ``B``.

    ``x_i = r_i`` (plain REINFORCE++), or ``x_i = r_i - mean_g(r)`` with ``subtract_group_mean``
    (REINFORCE++-baseline: the group mean removes the prompt's difficulty, the batch statistics
    scale it). Normalising by the *batch* std instead of each group's avoids GRPO's up-weighting
    of near-uniform groups. The std is the population one. Example ``r = (1, 0, 0, 0)`` (one
    batch): mean 0.25, std sqrt(3)/4, ``A = (sqrt(3), -1/sqrt(3), -1/sqrt(3), -1/sqrt(3))``.
    """
    x = rewards
    if subtract_group_mean:
        index, groups = dense_group_index(group_index, rewards.numel())
        x = rewards - group_mean(rewards, index, groups)
    if x.numel() < 2:
        return torch.zeros_like(x)
    return (x - x.mean()) / (x.std(unbiased=False) + eps)
