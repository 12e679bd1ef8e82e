"""A training step says where its time went (``step_<part>_s``): each part is charged the time its
own work took, and the parts add up to the step's ``train_s``."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.engine.training.test_learner_correctness import make_learner, make_samples

PARTS = ("plan", "pad", "proximal", "forward_backward", "stats", "optimizer")


def _slowed(fn: Any, seconds: float) -> Any:
    def slow(*args: Any, **kwargs: Any) -> Any:
        time.sleep(seconds)
        return fn(*args, **kwargs)
    return slow


@pytest.mark.parametrize(("method", "part"), [("plan", "plan"), ("optimizer_update", "optimizer"), ("_forward", "forward_backward")])
def test_a_slow_part_of_the_step_is_charged_to_that_part(tiny_calc_model, method: str, part: str) -> None:
    learner = make_learner(str(tiny_calc_model), micro_batch_tokens=4096)
    try:
        learner.train_step(make_samples(4, seed=1))  # warm-up
        setattr(learner, method, _slowed(getattr(learner, method), 0.4))
        m = learner.train_step(make_samples(4, seed=2))
    finally:
        learner.shutdown()
    parts = {p: m[f"step_{p}_s"] for p in PARTS}
    assert all(v >= 0 for v in parts.values()), parts
    assert parts[part] >= 0.4, parts
    assert all(v < 0.4 for p, v in parts.items() if p != part), parts
    assert sum(parts.values()) == pytest.approx(m["train_s"], abs=0.02), (parts, m["train_s"])
