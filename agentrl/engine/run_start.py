"""Where a training run starts: from the newest checkpoint of its run directory, from a
checkpoint the user names (``agentrl train --resume-from``), or from step 0 — and what happens
to an earlier run in the same directory, said in one plain sentence.

The rules (:func:`plan_start`):

- ``--fresh``: an earlier run in the directory is renamed aside (``RUN_DIR.old-YYYYmmdd-HHMMSS``)
  and the run starts over.
- ``--resume-from PATH``: a checkpoint folder (``RUN_DIR/checkpoints/step_N``) or a run
  directory (its newest checkpoint). A checkpoint of this run directory: the checkpoints after it
  are deleted (their steps are trained again). A checkpoint of another run: an earlier run here is
  renamed aside, and the checkpoint is linked in as this run's first.
- Otherwise (``checkpoint.resume``): an unfinished run with a checkpoint is resumed from its
  newest one. A finished run (``summary.json``), an earlier run that stopped before its first
  checkpoint, or ``checkpoint.resume = false`` with an earlier run: the earlier run is renamed
  aside and this one starts over (after an earlier run that stopped before its first checkpoint,
  its finished SFT stage, ``sft/``, is linked in and reused).
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from agentrl.engine.common.run_dir import RunDir
from agentrl.engine.loop.run_state import STATE_FILE, latest_checkpoint, link_tree, read_state
from agentrl.errors import ConfigError

__all__ = ["StartPlan", "plan_start", "set_aside"]


@dataclass
class StartPlan:
    """Where a run starts."""

    checkpoint: Path | None
    """The checkpoint folder (inside this run's ``checkpoints/``) to resume from; None: step 0."""
    message: str
    """What was decided, in a sentence for the console ("" when there is nothing to say: a new,
    empty run directory)."""


def _has_run(root: Path) -> bool:
    """Whether ``root`` holds anything of an earlier run (``agentrl eval``'s own folder,
    ``evals/``, alone is none: an evaluation before training does not make a run)."""
    return root.is_dir() and any(p.name != RunDir(root).evals.name for p in root.iterdir())


def set_aside(root: Path) -> Path:
    """Rename the run directory ``root`` to ``ROOT.old-YYYYmmdd-HHMMSS`` (``-2``, ``-3``... when
    taken); the new name."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = root.with_name(f"{root.name}.old-{stamp}")
    n = 2
    while target.exists():
        target = root.with_name(f"{root.name}.old-{stamp}-{n}")
        n += 1
    root.rename(target)
    return target


def _complete(folder: Path) -> bool:
    return (folder / STATE_FILE).is_file()


def _resolve_checkpoint(path: Path) -> Path:
    """The checkpoint folder that ``path`` names: itself, or a run directory's newest one."""
    if _complete(path):
        return path
    if path.is_dir():
        newest = latest_checkpoint(path)
        if newest is not None:
            return newest
    where = path / "checkpoints" if (path / "checkpoints").is_dir() else path.parent
    found = sorted(p.name for p in where.glob("step_*") if _complete(p)) if where.is_dir() else []
    raise ConfigError(
        f"--resume-from {path}: not a checkpoint (a folder RUN_DIR/checkpoints/step_N holding {STATE_FILE}) "
        f"nor a run directory with one" + (f"; complete checkpoints in {where}: {', '.join(found)}" if found else "")
    )


def plan_start(
    run_dir: RunDir, *, fresh: bool = False, resume_from: str | Path | None = None, resume: bool = True,
    model_path: str | None = None,
) -> StartPlan:
    """Decide where the run in ``run_dir`` starts, moving an earlier run aside or deleting
    checkpoints newer than ``resume_from`` as the rules above say. ``resume``: the recipe's
    ``checkpoint.resume``; ``model_path``: the recipe's ``model.path`` (a run directory that
    holds it is never moved). Raises ConfigError for a ``resume_from`` that is no checkpoint."""
    root = run_dir.root

    def aside(reason: str) -> str:
        if model_path is not None and Path(model_path).absolute().is_relative_to(root):
            raise ConfigError(
                f"{root}: {reason}, but model.path ({model_path}) lies inside that run directory, which would be "
                "renamed aside; give this run another run_dir (--set run_dir=...)"
            )
        return str(set_aside(root))

    if fresh and resume_from is not None:
        raise ConfigError("--fresh starts over and --resume-from goes on from a checkpoint: give one of them")
    if fresh:
        if not _has_run(root):
            return StartPlan(None, f"--fresh: {root} holds no earlier run; starting at step 0")
        old = aside("--fresh")
        return StartPlan(None, f"--fresh: starting over at step 0; the earlier run in {root} is kept as {old}")
    if resume_from is not None:
        src = _resolve_checkpoint(Path(resume_from).absolute())
        version = read_state(src).version
        target = run_dir.checkpoint(version)
        if src.parent == run_dir.checkpoints:
            dropped = sorted(p for p in run_dir.checkpoints.glob("step_*") if p.name > src.name)
            for p in dropped:
                shutil.rmtree(p)
            said = f"; the later checkpoints {', '.join(p.name for p in dropped)} are deleted" if dropped else ""
            (run_dir.summary).unlink(missing_ok=True)
            return StartPlan(src, f"--resume-from: going on from {src} (step {version}){said}")
        kept = ""
        if _has_run(root):
            kept = f"; the earlier run in {root} is kept as {aside('--resume-from a checkpoint of another run')}"
        target.parent.mkdir(parents=True, exist_ok=True)
        link_tree(src, target)
        return StartPlan(target, f"--resume-from: going on from {src} (step {version}), copied to {target}{kept}")
    newest = latest_checkpoint(root) if resume else None
    if not _has_run(root):
        return StartPlan(None, "")
    if run_dir.summary.exists():
        old = aside("a finished run is there")
        hint = f" (`--resume-from {old}` trains on from its newest checkpoint)" if latest_checkpoint(Path(old)) else ""
        return StartPlan(None, f"{root} held a finished run: starting a new run at step 0; the finished one is kept as {old}{hint}")
    if newest is not None:
        return StartPlan(newest, "")  # the controller says "resuming from ..."
    old = aside("an earlier run is there")
    if not resume:
        return StartPlan(None, f"{root}: checkpoint.resume = false, so this run starts over at step 0; the earlier run is kept as {old}")
    kept = ""
    sft = Path(old) / run_dir.sft.name
    if (sft / "config.json").is_file():  # its finished SFT stage is this recipe's: reused, not trained again
        root.mkdir(parents=True, exist_ok=True)
        link_tree(sft, run_dir.sft)
        kept = f"; its finished SFT stage is reused ({run_dir.sft})"
    return StartPlan(None, f"{root}: the earlier run there stopped before its first checkpoint, so this run starts over at step 0; "
                           f"the earlier run is kept as {old}{kept}")
