"""Zero-variance group filtering (DAPO's dynamic sampling, Yu et al., 2025).

The mask below is the formula. The recipe's ``algo.dynamic_sampling`` says where it applies:
``"drop"`` filters a batch with it (the batch shrinks), and ``"refill"`` applies it to each group
as it reaches the staleness queue. There a group without signal is set aside, and later groups
fill the batch within a budget (:mod:`agentrl.engine.loop.staleness`,
:func:`agentrl.engine.loop.batching.no_signal_reason`), as DAPO's over-sampling does.
"""

from __future__ import annotations

import torch

from agentrl.algos._groups import dense_group_index, group_std


def nonzero_variance_mask(rewards: torch.Tensor, group_index: torch.Tensor | None = None, atol: float = 1e-6) -> torch.Tensor:
    """``keep_i = std_g(r) > atol`` for sample ``i`` of group ``g`` (bool ``[N]``).

    A group whose samples all got the same reward has zero group-relative advantage for every
    sample: it adds no gradient, only dilutes the batch (and, with a token-mean loss, shrinks
    every other sample's weight). DAPO drops such groups and over-samples to refill the batch
    (agentrl: ``algo.dynamic_sampling = "refill"``; ``"drop"`` only drops them). Example: groups
    ``(1, 1) (0, 1)`` give ``keep = (False, False, True, True)``.
    """
    index, groups = dense_group_index(group_index, rewards.numel())
    return group_std(rewards.to(torch.float64), index, groups) > atol
