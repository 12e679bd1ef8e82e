"""Where a training step's time went: a lap clock whose named parts add up to the step's time.
The learner reports them as ``step_<part>_s`` (:meth:`agentrl.engine.training.learner.Learner.train_step`)."""

from __future__ import annotations

import time

__all__ = ["StepClock"]


class StepClock:
    """Splits a training step's time into named parts: each :meth:`lap` charges the seconds
    since the previous lap (or the step's start ``t0``, a ``time.monotonic()`` value) to its
    part, so the parts add up to the step's time up to the last lap."""

    PARTS = ("plan", "pad", "proximal", "forward_backward", "stats", "optimizer")

    def __init__(self, t0: float) -> None:
        self.last = t0
        self.parts = dict.fromkeys(self.PARTS, 0.0)

    def lap(self, part: str) -> None:
        now = time.monotonic()
        self.parts[part] += now - self.last
        self.last = now

    def seconds(self) -> dict[str, float]:
        """``step_<part>_s`` for every part."""
        return {f"step_{k}_s": v for k, v in self.parts.items()}
