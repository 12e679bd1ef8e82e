"""One entry point for the advantage estimators: pick one by name, apply it to a flat batch.

Each estimator lives in its own file (``grpo.py``, ``dr_grpo.py``, ``rloo.py``,
``reinforce_pp.py``) and returns one scalar per sample, which the learner broadcasts over the
sample's trained tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from agentrl.algos.dr_grpo import dr_grpo_advantages
from agentrl.algos.grpo import grpo_advantages
from agentrl.algos.reinforce_pp import reinforce_pp_advantages
from agentrl.algos.rloo import rloo_advantages

__all__ = ["ESTIMATORS", "compute_advantages", "group_advantages", "grpo_advantages", "dr_grpo_advantages"]

ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]] = {
    "grpo": grpo_advantages,
    "dr_grpo": dr_grpo_advantages,
    "rloo": rloo_advantages,
    "reinforce_pp": lambda r, g: reinforce_pp_advantages(r, g),
    "reinforce_pp_baseline": lambda r, g: reinforce_pp_advantages(r, g, subtract_group_mean=True),
}
"""Estimators by name (the recipe's ``algo.advantage``)."""


def compute_advantages(rewards: torch.Tensor, group_index: torch.Tensor | None, estimator: str = "grpo") -> torch.Tensor:
    """Apply ``estimator`` to ``rewards[N]`` with samples grouped by ``group_index[N]``."""
    try:
        fn = ESTIMATORS[estimator]
    except KeyError:
        raise ValueError(f"unknown advantage estimator {estimator!r}; expected one of {sorted(ESTIMATORS)}") from None
    if rewards.numel() == 0:
        return rewards.clone()
    return fn(rewards, group_index)


def group_advantages(groups: Sequence[Sequence[float]], estimator: str = "grpo") -> list[list[float]]:
    """Advantages for a batch given as a list of groups of rewards; same nesting out as in.

    Group-wise estimators treat each group on its own; REINFORCE++ normalises over all of them.
    """
    flat = [float(r) for g in groups for r in g]
    index = torch.tensor([gi for gi, g in enumerate(groups) for _ in g], dtype=torch.long)
    adv = compute_advantages(torch.tensor(flat, dtype=torch.float64), index, estimator).tolist()
    out, k = [], 0
    for g in groups:
        out.append(adv[k : k + len(g)])
        k += len(g)
    return out
