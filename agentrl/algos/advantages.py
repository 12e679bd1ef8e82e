"""Group-relative advantage estimators (one scalar per sample, broadcast over its tokens)."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def grpo_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """GRPO: ``A_i = (r_i - mean(r)) / (std(r) + eps)`` within one group.

    ``rewards`` is a 1-D tensor with one reward per sample of the group. The standard deviation
    is the population one (``unbiased=False``); a group whose rewards are all equal gets zeros.
    """
    mean = rewards.mean()
    std = rewards.std(unbiased=False) if rewards.numel() > 1 else torch.zeros((), dtype=rewards.dtype)
    return (rewards - mean) / (std + eps)


def dr_grpo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """Dr. GRPO: ``A_i = r_i - mean(r)`` within one group (no division by the std)."""
    return rewards - rewards.mean()


_ESTIMATORS = {"grpo": grpo_advantages, "dr_grpo": dr_grpo_advantages}


def group_advantages(groups: Sequence[Sequence[float]], estimator: str = "grpo") -> list[list[float]]:
    """Apply ``estimator`` (``grpo`` or ``dr_grpo``) to each group of rewards independently."""
    try:
        fn = _ESTIMATORS[estimator]
    except KeyError:
        raise ValueError(f"unknown advantage estimator {estimator!r}; expected one of {sorted(_ESTIMATORS)}") from None
    return [fn(torch.tensor(list(g), dtype=torch.float64)).tolist() if len(g) else [] for g in groups]
