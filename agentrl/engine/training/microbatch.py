"""How a batch of token rows is cut for training: mini-batches (one optimizer update each) and,
inside each, micro-batches of a bounded number of padded (or packed) tokens (one forward/backward pass each).

Shared by every FSDP rank (:mod:`agentrl.engine.training.fsdp_rank`): the learner and the critic plan their
work with the same two functions, so both ranks of a group always agree on the plan.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["PACKING", "packs_microbatches", "plan_microbatches", "split_minibatches"]

PACKING = ("auto", "on", "off")
"""``learner.pack_microbatches``: ``on`` lays a micro-batch's samples end to end in one row (no
padding); ``off`` pads them to the longest; ``auto`` packs where the attention implementation
runs each packed sequence on its own (flash attention's variable-length kernels), and pads
elsewhere: with ``sdpa`` or ``eager`` a packed row attends over all its ``N`` tokens, masked, which
costs ``N**2`` where padding costs ``B * T**2``."""


def packs_microbatches(setting: str, attn_implementation: str | None) -> bool:
    """Whether micro-batches are packed: ``setting`` is one of :data:`PACKING`,
    ``attn_implementation`` the model's (``config._attn_implementation``: "sdpa", "eager",
    "flash_attention_2", ...; None: unknown, which pads under ``auto``)."""
    if setting not in PACKING:
        raise ValueError(f"pack_microbatches must be one of {PACKING}, got {setting!r}")
    if setting != "auto":
        return setting == "on"
    return bool(attn_implementation) and str(attn_implementation).startswith("flash_attention")


def split_minibatches(n: int, updates: int) -> list[list[int]]:
    """Split sample indices ``0..n-1`` into ``min(updates, n)`` (at least one) contiguous,
    near-equal parts: one optimizer update each. ``split_minibatches(5, 2)`` is
    ``[[0, 1], [2, 3, 4]]``; with ``n = 0`` it is one empty part."""
    k = max(1, min(updates, n))
    bounds = [round(i * n / k) for i in range(k + 1)]
    return [list(range(bounds[i], bounds[i + 1])) for i in range(k)]


def plan_microbatches(
    lengths: list[int], token_budget: int, world_size: int, *, overhead_tokens: int | None = None, packed: bool = False
) -> list[list[int]]:
    """Group sample indices into micro-batches of at most ``token_budget`` padded tokens.

    A micro-batch pads its samples to its longest one, so it costs ``longest * count`` token
    slots; ``packed``: its samples are laid end to end in one row instead (no padding), so it
    costs the sum of their lengths. Each micro-batch also has a fixed cost (kernel launches, FSDP's parameter
    all-gathers), counted as ``overhead_tokens`` slots (default ``token_budget // 64``). With the
    samples sorted by length (longest first), the partition into contiguous runs that minimises
    ``sum(longest * count) + overhead_tokens * micro_batches`` under the budget is found by
    dynamic programming: few micro-batches *and* little padding (a greedy fill pads more for
    the same count). A sample longer than the budget gets a micro-batch of its own.

    When the number of micro-batches is not a multiple of ``world_size`` (every rank must run
    the same number of forward/backward passes: FSDP collectives must match), the costliest
    multi-sample micro-batches are split in two; only if that is impossible are empty
    micro-batches added. The plan is ordered by cost, descending. Every rank computes the same
    plan; rank ``r`` runs micro-batches ``r, r + world_size, ...``.
    """
    if token_budget <= 0 or world_size <= 0:
        raise ValueError(f"token_budget ({token_budget}) and world_size ({world_size}) must be positive")
    overhead = token_budget // 64 if overhead_tokens is None else overhead_tokens
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    sorted_len = np.array([lengths[i] for i in order], dtype=np.float64)
    n = len(order)
    total = np.concatenate([[0.0], np.cumsum(sorted_len)])  # total[j]: tokens of the j longest

    def run_cost(starts: Any, j: int) -> Any:
        """Slots of the micro-batch of sorted samples ``i..j-1`` for each ``i`` in ``starts`` (an
        array of starts gives an array of slots, one start one number)."""
        return total[j] - total[starts] if packed else sorted_len[starts] * (j - starts)

    best = np.zeros(n + 1)  # best[j]: cheapest plan of the j longest samples
    cut = np.zeros(n + 1, dtype=np.int64)
    lo = 0  # smallest start i such that samples i..j-1 fit the budget; never moves left as j grows
    for j in range(1, n + 1):
        while lo < j - 1 and run_cost(lo, j) > token_budget:
            lo += 1
        starts = np.arange(lo, j)  # last micro-batch = sorted samples i..j-1, longest sorted_len[i]
        costs = best[lo:j] + run_cost(starts, j) + overhead
        k = int(np.argmin(costs))
        best[j], cut[j] = costs[k], lo + k
    plan: list[list[int]] = []
    j = n
    while j > 0:
        plan.append(order[int(cut[j]) : j])
        j = int(cut[j])

    def cost(mb: list[int]) -> int:
        return sum(lengths[i] for i in mb) if packed else max((lengths[i] for i in mb), default=0) * len(mb)

    while len(plan) % world_size:
        splittable = [k for k, mb in enumerate(plan) if len(mb) > 1]
        if not splittable:
            break
        mb = plan.pop(max(splittable, key=lambda k: cost(plan[k])))
        plan += [mb[: len(mb) // 2], mb[len(mb) // 2 :]]
    plan.sort(key=lambda mb: -cost(mb))
    while len(plan) % world_size:
        plan.append([])
    return plan
