"""GRPO advantages (Shao et al., 2024, DeepSeekMath): group mean and standard deviation."""

from __future__ import annotations

import torch

from agentrl.algos._groups import dense_group_index, group_mean, group_std


def grpo_advantages(rewards: torch.Tensor, group_index: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """GRPO: ``A_i = (r_i - mean_g(r)) / (std_g(r) + eps)`` for sample ``i`` of group ``g``.

    ``rewards`` is ``[N]``; ``group_index`` (``[N]`` integers, ``None`` = one group) says which
    prompt each sample answers. The standard deviation is the population one
    (``unbiased=False``); a group whose rewards are all equal gets zeros. Example, one group
    ``r = (1, 0, 0, 1)``: mean 0.5, std 0.5, ``A = (1, -1, -1, 1)`` (with ``eps = 0``).
    """
    index, groups = dense_group_index(group_index, rewards.numel())
    return (rewards - group_mean(rewards, index, groups)) / (group_std(rewards, index, groups) + eps)
