"""benchmarks/ab_commits.py: what it reads from a run and how it compares two commits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmarks import benchmark_module



@pytest.fixture
def ab():
    with benchmark_module("ab_commits") as mod:
        yield mod


def fake_run(path: Path, step_s: float, fwd: list[float], command_s: float | None = None) -> Path:
    recs = [{"time": 100.0, "loop_start": True}]
    recs += [{"kind": "step", "time": 100.0 + step_s * (i + 1), "step_forward_backward_s": f} for i, f in enumerate(fwd)]
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    if command_s is not None:
        Path(f"{path}.command_s").write_text(f"{command_s}\n")
    return path


def test_a_run_is_read_as_loop_seconds_samples_per_second_and_step_medians_after_the_first(ab, tmp_path):
    stats = ab.run_stats(fake_run(tmp_path / "a_1", 2.0, [9.0, 1.0, 3.0, 2.0], command_s=60.0), samples_per_step=32)
    assert stats["loop_s"] == 8.0 and stats["samples_per_s"] == 16.0 and stats["command_s"] == 60.0
    assert stats["step_forward_backward_s"] == 2.0  # the warm-up step (9 s) is left out
    assert stats["generator_sleep_s"] == 0.0  # a field the run does not log reads as 0


def test_the_comparison_is_after_over_before_with_paired_repeats(ab):
    before = [{"samples_per_s": 10.0, "loop_s": 90.0}, {"samples_per_s": 12.0, "loop_s": 80.0}]
    after = [{"samples_per_s": 12.0, "loop_s": 75.0}, {"samples_per_s": 12.0, "loop_s": 70.0}]
    lines = ab.compare({"old": before, "new": after}, ("old", "new"))
    assert "| samples/s | 11.000 | 12.000 | 1.09x |" in lines
    assert "| RL loop s | 85.000 | 72.500 | 0.85x |" in lines
    assert lines[-1].endswith("1.20x, 1.00x; median 1.10x")


def outcome_run(path: Path, sft: list[float], rl: list[float], acc: list[float]) -> Path:
    recs = [{"kind": "sft", "sft_loss": x} for x in sft] + [{"kind": "step", "loss": x} for x in rl]
    recs += [{"kind": "eval", "accuracy": a, "reward_mean": a / 2} for a in acc]
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def test_the_outcome_says_which_losses_differ_and_by_how_much_and_lists_each_evaluation(ab, tmp_path):
    a = outcome_run(tmp_path / "a", [1.5, 1.25, 1.0], [0.5, 0.25], [0.25, 0.75])
    b = outcome_run(tmp_path / "b", [1.5, 1.25, 1.0], [0.5, 0.25 + 3e-8], [0.25, 0.5])
    row = ab.outcome({"old": [a], "new": [b]}, ("old", "new"))[-1]
    assert row.startswith("| 1 | all 3 equal bit for bit | 1 of 2 equal bit for bit; largest difference 3.00e-08 |")
    assert "| 0.250/0.750 | 0.250/0.500 | 0.125/0.375 | 0.125/0.250 |" in row


def test_runs_of_different_lengths_are_said_so_not_compared_pairwise(ab):
    assert ab.same_numbers([1.0, 2.0], [1.0]) == "2 against 1 records"
    assert ab.same_numbers([], []) == "none logged"
