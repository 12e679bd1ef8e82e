"""benchmarks/ab_outcome_stats.py: the permutation and sign tests, and the outcomes it reads from
a run's records."""

from __future__ import annotations

import json

import pytest

from tests.benchmarks import benchmark_module


@pytest.fixture(scope="module")
def stats():
    with benchmark_module("ab_outcome_stats") as mod:
        yield mod


def test_fully_separated_groups_get_the_smallest_permutation_p_and_equal_ones_get_one(stats):
    assert stats.permutation_p([3.0, 4.0, 5.0], [0.0, 1.0, 2.0]) == pytest.approx(1 / 20)  # 1 of C(6,3) splits
    assert stats.permutation_p([1.0, 1.0], [1.0, 1.0]) == 1.0
    assert stats.permutation_p([0.0, 1.0, 2.0], [3.0, 4.0, 5.0]) == 1.0  # the other direction: one-sided


def test_sign_test(stats):
    assert stats.sign_p(6, 6) == pytest.approx(1 / 64)
    assert stats.sign_p(0, 6) == 1.0
    assert stats.sign_p(5, 6) == pytest.approx(7 / 64)


def test_outcomes_read_the_evaluation_at_the_version_and_the_steps_mean_reward(stats, tmp_path):
    recs = [{"kind": "eval", "version": 0, "accuracy": 0.3}, {"kind": "step", "reward_mean": 0.5},
            {"kind": "step", "reward_mean": 0.7}, {"kind": "eval", "version": 120, "accuracy": 0.6},
            {"kind": "step"}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert stats.outcomes(tmp_path, 120) == (0.6, pytest.approx(0.6))
    assert stats.outcomes(tmp_path, 40) == (None, pytest.approx(0.6))
