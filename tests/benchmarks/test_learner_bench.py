"""benchmarks/learner.py's order of configurations within a repeat."""

from __future__ import annotations

from tests.benchmarks import benchmark_module


def test_rotate_starts_each_repeat_one_configuration_later_and_runs_each_once() -> None:
    with benchmark_module("learner") as bench:
        configs = ["learner", "plain", "learner-actor"]
        orders = [bench.repeat_order(configs, rep, True) for rep in range(4)]
        assert orders == [configs, ["plain", "learner-actor", "learner"], ["learner-actor", "learner", "plain"], configs]
        assert [order[-1] for order in orders[:3]] == ["learner-actor", "learner", "plain"]  # none always last
        assert all(bench.repeat_order(configs, rep, False) == configs for rep in range(3))
