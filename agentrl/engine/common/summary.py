"""What a finished run produced: :class:`RunSummary` and ``summary.json``."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["RunSummary", "write_summary"]


@dataclass
class RunSummary:
    """What a finished run produced."""

    run_dir: Path
    steps: int
    version: int
    final_checkpoint: Path
    samples_trained: int
    dropped_stale: int
    infra_failures: int
    agent_failures: int = 0
    """Agent episodes whose agent program raised or never returned (kept out of the loss)."""
    prompt_cursor: int = 0
    """Prompt indices ``0 .. prompt_cursor - 1`` were issued."""
    untrained_prompts: list[int] = field(default_factory=list)
    """Issued prompts not trained when the run ended (queued, in flight or waiting for a retry)."""
    dropped_prompts: list[int] = field(default_factory=list)
    """Prompts whose groups were dropped as over-stale."""
    abandoned_prompts: list[int] = field(default_factory=list)
    """Prompts given up after their whole group failed on infrastructure ``max_attempts`` times
    (counted since the process started)."""
    set_aside_prompts: dict[str, list[int]] = field(default_factory=dict)
    """Prompts sampled but set aside as carrying no learning signal (``algo.dynamic_sampling =
    "refill"``), by reason: ``"solved"``, ``"failed"``."""
    ended_early: str = ""
    """Why the run ended before ``learner.max_steps`` (a mastered task), in words; "" when it did not."""


def write_summary(path: Path, summary: RunSummary, evals: list[dict[str, Any]]) -> None:
    """Write ``summary.json`` at ``path``: the run's outcome, with the first and last evaluation
    records (``evals``) and the accuracy gained between them."""
    data: dict[str, Any] = {
        "steps": summary.steps,
        "version": summary.version,
        "samples_trained": summary.samples_trained,
        "dropped_stale": summary.dropped_stale,
        "infra_failures": summary.infra_failures,
        "agent_failures": summary.agent_failures,
        "final_checkpoint": str(summary.final_checkpoint),
        "prompt_cursor": summary.prompt_cursor,
        "untrained_prompts": summary.untrained_prompts,
        "dropped_prompts": summary.dropped_prompts,
        "abandoned_prompts": summary.abandoned_prompts,
        "set_aside_prompts": summary.set_aside_prompts,
        "ended_early": summary.ended_early,
    }
    if evals:
        data["eval_before"] = evals[0]
        data["eval_after"] = evals[-1]
        data["accuracy_gain"] = evals[-1]["accuracy"] - evals[0]["accuracy"]
    Path(path).write_text(json.dumps(data, indent=2))
