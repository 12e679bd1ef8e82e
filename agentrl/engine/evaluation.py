"""Held-out evaluation: play one episode per row with the current weights and summarise.

Metrics (fractions in [0, 1] unless said otherwise):

- ``accuracy``: episodes with reward >= 1 (the task solved);
- ``reward_mean``: mean episode reward;
- ``tool_call_rate``: episodes that made at least one tool call;
- ``turns_mean``: mean model turns per episode (a count);
- ``infra_failures``: episodes lost to the infrastructure (excluded from the other metrics; a count).
"""

from __future__ import annotations

import asyncio
from typing import Any

from agentrl.engine.trajectory import Trajectory

__all__ = ["evaluate", "summarise"]


def summarise(trajs: list[Trajectory]) -> dict[str, float]:
    """The evaluation metrics of a list of episodes (see the module docstring)."""
    ok = [t for t in trajs if t.trainable]
    n = max(1, len(ok))
    return {
        "accuracy": sum(1 for t in ok if t.reward >= 1.0) / n,
        "reward_mean": sum(t.reward for t in ok) / n,
        "tool_call_rate": sum(1 for t in ok if t.metrics.get("tool_calls", 0) > 0) / n,
        "turns_mean": sum(t.metrics.get("turns", 0) for t in ok) / n,
        "episodes": float(len(ok)),
        "infra_failures": float(len(trajs) - len(ok)),
    }


async def evaluate(
    workers: list[Any], rows: list[dict[str, Any]], sampling: dict[str, Any], *, timeout_s: float
) -> tuple[dict[str, float], list[Trajectory]]:
    """Play one episode for each row on the rollout ``workers`` (Ray handles) with ``sampling``
    (e.g. greedy: ``{"temperature": 0.0}``); return (metrics, episodes)."""
    calls = [
        workers[i % len(workers)].run_group.remote(row, i, f"eval{i}", 1, sampling)
        for i, row in enumerate(rows)
    ]
    groups = await asyncio.wait_for(asyncio.gather(*calls), timeout_s)
    trajs = [t for g in groups for t in g]
    return summarise(trajs), trajs
