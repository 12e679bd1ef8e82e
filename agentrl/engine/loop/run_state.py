"""Resumable run state: what the controller saves beside the learner's checkpoint.

A checkpoint is a folder ``RUN_DIR/checkpoints/step_NNNNNN/`` holding

- ``learner/``: the learner ranks' state (model, optimizer, scheduler, step, RNG), written by
  ``Learner.save_checkpoint``;
- ``weights/``: the Hugging Face folder of weight version N (generators restart from it);
- ``state.pkl``: the controller's :class:`RunState` — the queue's finished-but-untrained groups,
  the prompt cursor, the prompts that were in flight (re-issued on resume), counters.

It is written under a temporary name and renamed into place, so a folder with ``state.pkl`` is
complete; a run killed mid-checkpoint resumes from the previous one. Together with the
``trained.jsonl`` audit log (one line per learner step with the prompt indices it trained) this
makes resume lossless: every prompt index below the cursor is trained exactly once, waiting in
the queue, re-issued, set aside as carrying no learning signal (refill, with its reason), or
counted as dropped (stale or infra failure).
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.engine.loop.staleness import QueueStats, RefillRound
from agentrl.engine.common.trajectory import Trajectory

__all__ = [
    "RunState",
    "checkpoint_root",
    "latest_checkpoint",
    "link_tree",
    "write_checkpoint_state",
    "read_state",
    "prune_checkpoints",
    "truncate_logs",
]

STATE_FILE = "state.pkl"


@dataclass
class RunState:
    """The controller's part of a checkpoint, taken right after learner step ``version``."""

    version: int
    """Learner version (= completed learner steps) at the checkpoint."""
    cursor: int
    """Next fresh prompt index (prompt ``i`` is dataset row ``i % len(rows)``)."""
    reissue: list[int]
    """Prompt indices to start first on resume: waiting retries and groups in flight."""
    queued: list[list[Trajectory]]
    """Finished groups not yet trained."""
    stats: QueueStats
    """Queue counters (``started`` excludes the re-issued prompts)."""
    infra_failures: int = 0
    """Samples lost to the infrastructure so far."""
    agent_failures: int = 0
    """Samples lost because the agent program failed so far (agent episodes)."""
    gen_tokens: int = 0
    """Generated tokens so far (throughput bookkeeping)."""
    evals: list[dict[str, Any]] = field(default_factory=list)
    """Evaluation records so far."""
    abandoned: list[int] = field(default_factory=list)
    """Prompt indices given up after repeated infrastructure failures."""
    set_aside: list[tuple[int, str]] = field(default_factory=list)
    """``(prompt index, reason)`` of every group set aside as carrying no learning signal
    (refill: ``"solved"`` or ``"failed"``), in order: sampled, never trained, not re-issued."""
    refill_round: RefillRound | None = None
    """The set-aside account of the batch in the making (refill; None: empty)."""


def checkpoint_root(run_dir: Path) -> Path:
    """``RUN_DIR/checkpoints``."""
    return Path(run_dir) / "checkpoints"


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint folder, or None."""
    root = checkpoint_root(run_dir)
    if not root.exists():
        return None
    done = sorted(p for p in root.iterdir() if p.name.startswith("step_") and (p / STATE_FILE).exists())
    return done[-1] if done else None


def write_checkpoint_state(folder: Path, state: RunState) -> None:
    """Write ``state.pkl`` into ``folder`` last (its presence marks the checkpoint complete)."""
    tmp = folder / (STATE_FILE + ".tmp")
    with tmp.open("wb") as f:
        pickle.dump(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, folder / STATE_FILE)


def read_state(folder: Path) -> RunState:
    """Load the controller state of a checkpoint."""
    with (Path(folder) / STATE_FILE).open("rb") as f:
        return pickle.load(f)


def link_tree(src: Path, dst: Path) -> None:
    """Copy the folder ``src`` to ``dst`` as hard links (no data copied; deleting ``src`` later
    leaves ``dst`` whole), falling back to a real copy per file where linking fails (another
    filesystem). Published folders are never modified in place, so sharing their files is safe."""

    def link_or_copy(a: str, b: str) -> None:
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    shutil.copytree(src, dst, copy_function=link_or_copy)


def prune_checkpoints(run_dir: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` complete checkpoints and any incomplete leftovers."""
    root = checkpoint_root(run_dir)
    if not root.exists():
        return
    complete = sorted(p for p in root.iterdir() if p.name.startswith("step_") and (p / STATE_FILE).exists())
    for p in complete[:-keep] if keep else complete:
        shutil.rmtree(p, ignore_errors=True)
    for p in root.iterdir():
        if p.name.startswith(".") or (p.name.startswith("step_") and not (p / STATE_FILE).exists()):
            shutil.rmtree(p, ignore_errors=True)


def truncate_logs(run_dir: Path, step: int) -> None:
    """Drop step records after ``step`` from ``metrics.jsonl`` and ``trained.jsonl``: those steps
    were lost with the killed run and will be trained again from the checkpoint."""
    for name in ("metrics.jsonl", "trained.jsonl"):
        path = Path(run_dir) / name
        if not path.exists():
            continue
        keep = []
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:  # a line cut by the kill
                continue
            if rec.get("kind", "step") in ("step", "eval") and rec.get("step", rec.get("version", 0)) > step:
                continue
            keep.append(line)
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(line + "\n" for line in keep))
        os.replace(tmp, path)
