"""Every path of a run, in one place: ``RunDir(root).weights_version(3)`` and so on.

::

    RUN_DIR/
      recipe.json             the validated recipe the run used
      metrics.jsonl           one record per step, evaluation, event (see MetricsLogger)
      trained.jsonl           one line per learner step: the prompt indices it trained
      samples.jsonl           a few decoded episodes per step (for reading)
      eval_samples.jsonl      a few decoded evaluation episodes
      summary.json            the run's outcome
      audit/                  append-only logs of the learner and rollout workers (engine.audit)
      logs/                   what each actor printed: generator-0.log (vLLM), learner-0.log, rollout-0.log
      weights/v000003/        published weight version 3 (a Hugging Face folder)
      checkpoints/step_000004/  resumable checkpoints (engine.run_state)
      sft/                    the model after the SFT stage
      final/                  the final model (LoRA: merged)
      final_adapter/          the final LoRA adapter (LoRA runs)
      evals/20261125-201500/  one ``agentrl eval`` of this recipe: a run directory of its own
                              (recipe.json, metrics.jsonl, eval_samples.jsonl, summary.json,
                              logs/, report/); the training run's files are never touched
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["RunDir", "version_folder", "version_of"]

_VERSION_PREFIX = "v"
_VERSION_DIGITS = 6


def version_folder(weights: str | os.PathLike[str], version: int) -> Path:
    """The folder of weight version ``version`` under the weights folder ``weights``."""
    return Path(weights) / f"{_VERSION_PREFIX}{version:0{_VERSION_DIGITS}d}"


def version_of(folder: str | os.PathLike[str]) -> int | None:
    """The version a folder named by :func:`version_folder` holds, or None for another name."""
    name = Path(folder).name
    digits = name[len(_VERSION_PREFIX):]
    return int(digits) if name.startswith(_VERSION_PREFIX) and digits.isdigit() else None


@dataclass(frozen=True)
class RunDir:
    """The files and folders of one run under ``root`` (an absolute path)."""

    root: Path

    @property
    def recipe(self) -> Path:
        return self.root / "recipe.json"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def trained(self) -> Path:
        return self.root / "trained.jsonl"

    @property
    def logs(self) -> Path:
        """``RUN_DIR/logs``: one file per actor with everything it (and vLLM, Ray, transformers in
        it) printed."""
        return self.root / "logs"

    @property
    def samples(self) -> Path:
        return self.root / "samples.jsonl"

    @property
    def eval_samples(self) -> Path:
        return self.root / "eval_samples.jsonl"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

    @property
    def weights(self) -> Path:
        """The folder of published weight versions."""
        return self.root / "weights"

    @property
    def evals(self) -> Path:
        """``RUN_DIR/evals``: one folder per ``agentrl eval`` (see :meth:`new_eval_dir`)."""
        return self.root / "evals"

    def new_eval_dir(self) -> Path:
        """Create and return a new, empty ``RUN_DIR/evals/YYYYmmdd-HHMMSS`` (``-2``, ``-3``...
        when that second is taken): the run directory of one evaluation, so that it never
        writes over the training run's summary, metrics or samples."""
        self.evals.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        target, n = self.evals / stamp, 2
        while True:
            try:
                target.mkdir()
                return target
            except FileExistsError:
                target, n = self.evals / f"{stamp}-{n}", n + 1

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def sft(self) -> Path:
        return self.root / "sft"

    @property
    def final(self) -> Path:
        return self.root / "final"

    @property
    def final_adapter(self) -> Path:
        """The final LoRA adapter (LoRA runs; ``final/`` holds the merged model)."""
        return self.root / "final_adapter"

    def checkpoint(self, version: int) -> Path:
        """The checkpoint folder of the state after learner step ``version``."""
        return self.checkpoints / f"step_{version:06d}"

    def weights_version(self, version: int) -> Path:
        """The folder of published weight version ``version``."""
        return version_folder(self.weights, version)

    def versions_on_disk(self) -> list[int]:
        """Published versions whose folders exist, ascending."""
        if not self.weights.is_dir():
            return []
        return sorted(v for p in self.weights.iterdir() if p.is_dir() and (v := version_of(p)) is not None)

    def newest_on_disk(self, at_most: int) -> tuple[int, Path | None]:
        """The newest published folder of a version in ``1 .. at_most``: ``(version, folder)``,
        or ``(0, None)`` when there is none (start from the initial model)."""
        newest = max((v for v in self.versions_on_disk() if 0 < v <= at_most), default=0)
        return (newest, self.weights_version(newest)) if newest else (0, None)
