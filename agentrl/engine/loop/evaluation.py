"""Held-out evaluation: play one episode per row with the current weights and summarise.

Metrics (fractions in [0, 1] unless said otherwise):

- ``accuracy``: episodes with reward >= 1 (the task solved);
- ``reward_mean``: mean episode reward;
- ``tool_call_rate``: episodes that made at least one tool call;
- ``turns_mean``: mean model turns per episode (a count);
- ``infra_failures``: episodes lost to the infrastructure (excluded from the other metrics; a count);
- ``agent_failures``: agent episodes whose agent program failed (excluded likewise; a count);
- ``overflow_before_generating``: episodes whose prompt alone exceeded the token limit (a count),
  and ``overflow_prompt_tokens`` the longest such prompt.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from agentrl.engine.loop.degenerate import diagnose_eval
from agentrl.engine.common.trajectory import AGENT_FAILURE, Trajectory

__all__ = ["Evaluator", "evaluate", "summarise"]


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
        "infra_failures": float(sum(not t.trainable and t.status != AGENT_FAILURE for t in trajs)),
        "agent_failures": float(sum(t.status == AGENT_FAILURE for t in trajs)),
        "overflow_before_generating": float(sum(t.status == "overflow" and t.num_generated == 0 for t in trajs)),
        "overflow_prompt_tokens": float(max((len(t.tokens) for t in trajs if t.status == "overflow" and t.num_generated == 0), default=0)),
    }


async def evaluate(
    workers: list[Any], rows: list[dict[str, Any]], sampling: dict[str, Any], *, timeout_s: float
) -> tuple[dict[str, float], list[Trajectory]]:
    """Play one episode for each row on the rollout ``workers`` (Ray handles) with ``sampling``
    (e.g. greedy: ``{"temperature": 0.0}``); return (metrics, episodes)."""
    calls = [
        workers[i % len(workers)].run_group.remote(row, i, f"eval{i}", 1, sampling, score=False)  # the environment's reward alone
        for i, row in enumerate(rows)
    ]
    groups = await asyncio.wait_for(asyncio.gather(*calls), timeout_s)
    trajs = [t for g in groups for t in g]
    return summarise(trajs), trajs


class Evaluator:
    """Evaluates the generators' current weights on held-out ``rows`` through the rollout
    ``workers`` (a callable returning the current handles), at ``temperature``, within
    ``timeout_s``; logs each evaluation to ``log`` (a MetricsLogger), appends its first ``samples``
    episodes to ``samples_path`` (decoded, with their reward, status, turns, tool calls and error)
    and keeps the records (:attr:`records`; ``records`` seeds them on a resume)."""

    def __init__(
        self, *, workers: Any, rows: list[dict[str, Any]], temperature: float, timeout_s: float, log: Any,
        samples_path: Any, records: list[dict[str, Any]] | None = None, samples: int = 4,
    ) -> None:
        self.workers = workers
        self.rows = rows
        self.temperature = temperature
        self.timeout_s = timeout_s
        self.log = log
        self.samples_path = samples_path
        self.samples = samples
        self.records: list[dict[str, Any]] = list(records or [])

    async def __call__(self, version: int) -> dict[str, Any]:
        """Evaluate weights ``version``; the logged record."""
        t0 = time.monotonic()
        metrics, trajs = await evaluate(self.workers(), self.rows, {"temperature": self.temperature}, timeout_s=self.timeout_s)
        rec = self.log.log("eval", version=version, **metrics, eval_s=time.monotonic() - t0)
        self.records.append(rec)
        self.log.console.print(
            f"[bold]eval v{int(version)}[/]: accuracy {metrics['accuracy']:.3f}  tool-call rate "
            f"{metrics['tool_call_rate']:.3f}  turns {metrics['turns_mean']:.2f}  "
            f"({int(metrics['episodes'])} episodes, {time.monotonic() - t0:.0f} s)"
        )
        problem = diagnose_eval(metrics)
        if problem:
            self.log.warning(f"evaluation v{version} is degenerate: {problem}", degenerate=problem, version=version)
        with open(self.samples_path, "a") as f:
            f.writelines(json.dumps({"version": version, "group_id": t.group_id, "reward": t.reward, "status": t.status,
                                     "turns": t.metrics.get("turns", 0), "tool_calls": t.metrics.get("tool_calls", 0),
                                     "text": t.info.get("text", ""), "spans": t.info.get("spans", []),
                                     **({"error": t.info["error"]} if t.info.get("error") else {})}) + "\n"
                         for t in trajs[: self.samples])
        return rec
