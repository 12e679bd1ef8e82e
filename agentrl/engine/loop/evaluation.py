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

ReTool's measurements of tool use (over the same episodes):

- ``tool_calls_mean``: tool calls (code blocks) per episode (a count);
- ``tool_error_rate``: the share of those calls that failed (code that raised, a malformed call);
- ``tool_error_episodes``: episodes with at least one failed call (a count), and
  ``recovery_rate`` the share of them that still solved the task (0 when there were none);
- ``response_tokens_mean``: tokens the model wrote per episode, over all its turns (a count).

Where the episodes' time went (seconds per episode, each on its own clock: they run concurrently):
``episode_s_mean``, ``episode_generate_s_mean`` (awaiting the generator) and
``episode_env_s_mean`` (awaiting the environment's tools and sandbox)
(:func:`~agentrl.engine.common.trajectory.episode_time_means`).

An evaluation may hold further named sets (``[eval.sets.NAME]``, e.g. an out-of-distribution
set): each is played with the same weights and its metrics join the record as ``NAME/accuracy``,
``NAME/tool_call_rate`` and so on.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from rich.markup import escape

from agentrl.engine.loop.degenerate import diagnose_eval
from agentrl.engine.common.trajectory import AGENT_FAILURE, Trajectory, episode_time_means

__all__ = ["Evaluator", "eval_sets", "evaluate", "summarise"]


def summarise(trajs: list[Trajectory]) -> dict[str, float]:
    """The evaluation metrics of a list of episodes (see the module docstring)."""
    ok = [t for t in trajs if t.trainable]
    n = max(1, len(ok))
    calls = sum(t.metrics.get("tool_calls", 0) for t in ok)
    erred = [t for t in ok if t.metrics.get("tool_errors", 0) > 0]
    return {
        "accuracy": sum(1 for t in ok if t.reward >= 1.0) / n,
        "reward_mean": sum(t.reward for t in ok) / n,
        "tool_call_rate": sum(1 for t in ok if t.metrics.get("tool_calls", 0) > 0) / n,
        "turns_mean": sum(t.metrics.get("turns", 0) for t in ok) / n,
        "tool_calls_mean": calls / n,
        "tool_error_rate": sum(t.metrics.get("tool_errors", 0) for t in ok) / max(1, calls),
        "tool_error_episodes": float(len(erred)),
        "recovery_rate": sum(1 for t in erred if t.reward >= 1.0) / max(1, len(erred)),
        "response_tokens_mean": sum(t.metrics.get("generated_tokens", t.num_generated) for t in ok) / n,
        "episodes": float(len(ok)),
        "infra_failures": float(sum(not t.trainable and t.status != AGENT_FAILURE for t in trajs)),
        "agent_failures": float(sum(t.status == AGENT_FAILURE for t in trajs)),
        **episode_time_means(ok),
        "overflow_before_generating": float(sum(t.status == "overflow" and t.num_generated == 0 for t in trajs)),
        "overflow_prompt_tokens": float(max((len(t.tokens) for t in trajs if t.status == "overflow" and t.num_generated == 0), default=0)),
    }


def eval_sets(records: list[dict[str, Any]]) -> list[str]:
    """The names of the further held-out sets in evaluation ``records`` (keys ``NAME/accuracy``), in first-seen order."""
    names: dict[str, None] = {}
    for r in records:
        for key in r:
            if key.endswith("/accuracy"):
                names.setdefault(key[: -len("/accuracy")], None)
    return list(names)


async def evaluate(
    workers: list[Any], rows: list[dict[str, Any]], sampling: dict[str, Any], *, timeout_s: float, prefix: str = "eval"
) -> tuple[dict[str, float], list[Trajectory]]:
    """Play one episode for each row on the rollout ``workers`` (Ray handles) with ``sampling``
    (e.g. greedy: ``{"temperature": 0.0}``), as groups ``<prefix><row index>``; return (metrics, episodes)."""
    calls = [
        workers[i % len(workers)].run_group.remote(row, i, f"{prefix}{i}", 1, sampling, score=False)  # the environment's reward alone
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
    and keeps the records (:attr:`records`; ``records`` seeds them on a resume). ``sets`` maps the
    names of further held-out sets to their rows: each is played in the same evaluation and its
    metrics are logged as ``NAME/metric`` in the same record (its episodes are not sampled)."""

    def __init__(
        self, *, workers: Any, rows: list[dict[str, Any]], temperature: float, timeout_s: float, log: Any,
        samples_path: Any, records: list[dict[str, Any]] | None = None, samples: int = 4,
        sets: dict[str, list[dict[str, Any]]] | None = None,
    ) -> None:
        self.workers = workers
        self.rows = rows
        self.sets = dict(sets or {})
        self.temperature = temperature
        self.timeout_s = timeout_s
        self.log = log
        self.samples_path = samples_path
        self.samples = samples
        self.records: list[dict[str, Any]] = list(records or [])

    async def __call__(self, version: int) -> dict[str, Any]:
        """Evaluate weights ``version``; the logged record."""
        t0 = time.monotonic()
        sampling = {"temperature": self.temperature}
        metrics, trajs = await evaluate(self.workers(), self.rows, sampling, timeout_s=self.timeout_s)
        extra: dict[str, float] = {}
        for name, rows in self.sets.items():
            left = max(1.0, self.timeout_s - (time.monotonic() - t0))  # one budget for the whole evaluation
            set_metrics, _ = await evaluate(self.workers(), rows, sampling, timeout_s=left, prefix=f"eval-{name}-")
            extra.update({f"{name}/{k}": v for k, v in set_metrics.items()})
        rec = self.log.log("eval", version=version, **metrics, **extra, eval_s=time.monotonic() - t0)
        self.records.append(rec)
        others = "".join(f"  {name} accuracy {extra[f'{name}/accuracy']:.3f}" for name in self.sets)
        self.log.console.print(
            f"[bold]eval v{int(version)}[/]: accuracy {metrics['accuracy']:.3f}{escape(others)}  tool-call rate "
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
