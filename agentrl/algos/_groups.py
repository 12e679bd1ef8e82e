"""Per-group statistics over a flat batch: the helpers every group-relative estimator shares.

A batch of ``N`` samples is described by ``rewards[N]`` and ``group_index[N]`` (integers
``0..G-1``, one per prompt). Groups may have different sizes (a sample lost to an
infrastructure failure leaves its group one short).
"""

from __future__ import annotations

import torch


def dense_group_index(group_index: torch.Tensor | None, n: int) -> tuple[torch.Tensor, int]:
    """Return ``(index, G)`` with ``index`` relabelled to ``0..G-1``; ``None`` means one group."""
    if group_index is None:
        return torch.zeros(n, dtype=torch.long), 1
    if group_index.shape != (n,):
        raise ValueError(f"group_index has shape {tuple(group_index.shape)}; expected ({n},)")
    uniq, dense = torch.unique(group_index, return_inverse=True)
    return dense.long(), int(uniq.numel())


def group_count(index: torch.Tensor, num_groups: int, dtype: torch.dtype) -> torch.Tensor:
    """``n_g``: samples per group, ``[G]``."""
    return torch.zeros(num_groups, dtype=dtype).index_add_(0, index, torch.ones(index.numel(), dtype=dtype))


def group_mean(values: torch.Tensor, index: torch.Tensor, num_groups: int) -> torch.Tensor:
    """``mean_g = (1/n_g) * sum_{i in g} values_i``, broadcast back to each sample: ``[N]``."""
    sums = torch.zeros(num_groups, dtype=values.dtype).index_add_(0, index, values)
    return (sums / group_count(index, num_groups, values.dtype).clamp_min(1))[index]


def group_std(values: torch.Tensor, index: torch.Tensor, num_groups: int) -> torch.Tensor:
    """Population standard deviation within each group (``unbiased=False``), per sample: ``[N]``."""
    mean = group_mean(values, index, num_groups)
    return group_mean((values - mean) ** 2, index, num_groups).sqrt()
