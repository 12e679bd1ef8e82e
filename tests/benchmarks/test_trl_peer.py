"""The aggregation of benchmarks/trl_peer.py (issue 33): per-seed ratios, medians over seeds, the
goal check, and the per-step splits and RL-loop clock read from run records. Pure functions on
made-up runs: no TRL, no training."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "trl_peer.py"
_spec = importlib.util.spec_from_file_location("trl_peer", _PATH)
assert _spec is not None and _spec.loader is not None
peer = importlib.util.module_from_spec(_spec)
sys.modules["trl_peer"] = peer  # dataclasses look their module up by name
_spec.loader.exec_module(peer)


def _run(seed: int, side: str, rl_s: float, curve: list[tuple[int, float, float]] = (), steps: int = 120, command_s: float = 100.0):
    return peer.Run(seed=seed, side=side, steps=steps, rl_s=rl_s, command_s=command_s,
                    curve=[{"step": st, "s": s, "accuracy": a} for st, s, a in curve])


TRL_CURVE = [(0, 0.0, 0.37), (20, 16.0, 0.62), (40, 30.0, 0.60)]  # final 0.60, first reached at 16 s


def test_ratios_and_their_median_are_agentrl_over_trl_per_seed() -> None:
    # TRL: 3840 episodes in 96 s = 40/s every seed; agentrl: 60/s, 48/s, 56/s
    runs = [_run(s, "TRL", 96.0, TRL_CURVE) for s in (0, 1, 2)]
    runs += [_run(0, "agentrl", 64.0, [(0, 0, 0.37), (20, 10.0, 0.61)]), _run(1, "agentrl", 80.0, [(0, 0, 0.37), (20, 12.0, 0.55)]),
             _run(2, "agentrl", 3840 / 56, [(0, 0, 0.37), (20, 15.0, 0.6)])]
    assert runs[0].samples_per_s == pytest.approx(40.0)
    goal = peer.check_goal(runs)
    assert goal.ratios == pytest.approx({0: 1.5, 1: 1.2, 2: 1.4})
    assert goal.median_ratio == pytest.approx(1.4)
    assert goal.speed_met
    # seed 0: 10 s < 16 s; seed 1: never reaches 0.60; seed 2: 15 s < 16 s -> 2 of 3
    assert [r.agentrl_sooner for r in goal.races] == [True, False, True]
    assert goal.races[1].agentrl_s is None and goal.races[0].trl_s == 16.0 and goal.races[0].target == 0.60
    assert goal.accuracy_met and goal.met is True
    text = "\n".join(peer.goal_lines(goal))
    assert "**met**" in text and "1.40x" in text and "sooner in 2 of 3 seeds" in text


def test_the_goal_is_not_met_when_either_part_fails() -> None:
    slow = [_run(s, "TRL", 96.0, TRL_CURVE) for s in (0, 1, 2)]
    slow += [_run(s, "agentrl", 3840 / r, [(0, 0, 0.37), (20, 5.0, 0.7)]) for s, r in ((0, 48.0), (1, 50.0), (2, 60.0))]
    goal = peer.check_goal(slow)
    assert goal.median_ratio == pytest.approx(1.25) and not goal.speed_met
    assert goal.accuracy_met and goal.met is False
    assert "**not met**" in "\n".join(peer.goal_lines(goal))
    # fast, but reaching TRL's final accuracy later (or at the same second) in half the seeds: not more than half
    late = [_run(s, "TRL", 96.0, TRL_CURVE) for s in (0, 1)]
    late += [_run(0, "agentrl", 48.0, [(0, 0, 0.37), (20, 16.0, 0.6)]), _run(1, "agentrl", 48.0, [(0, 0, 0.37), (20, 8.0, 0.6)])]
    goal = peer.check_goal(late)
    assert goal.speed_met and [r.agentrl_sooner for r in goal.races] == [False, True]
    assert goal.accuracy_met is False and goal.met is False


def test_without_evaluations_the_goal_is_undecided() -> None:
    runs = [_run(0, "TRL", 96.0), _run(0, "agentrl", 48.0)]
    goal = peer.check_goal(runs)
    assert goal.speed_met and goal.accuracy_met is None and goal.met is None
    with pytest.raises(ValueError):
        peer.check_goal([_run(0, "TRL", 96.0), _run(1, "agentrl", 48.0)])  # no seed with both sides


def test_side_medians_over_seeds() -> None:
    runs = [_run(0, "agentrl", 64.0, [(0, 0, 0.3), (20, 50.0, 0.65)], command_s=200.0),
            _run(1, "agentrl", 80.0, [(0, 0, 0.3), (20, 40.0, 0.55)], command_s=260.0),
            _run(2, "agentrl", 96.0, [(0, 0, 0.3), (20, 30.0, 0.61)], command_s=220.0)]
    m = peer.summarise(runs, "agentrl", threshold=0.6)
    assert m.samples_per_s == pytest.approx(48.0)  # 60, 48, 40
    assert m.command_s == 220.0 and m.final_accuracy == pytest.approx(0.61)
    assert m.to_threshold_s == pytest.approx(40.0) and m.reached == 2  # median of 50 and 30; seed 1 never reached
    with pytest.raises(ValueError):
        peer.summarise(runs, "TRL", threshold=0.6)


def test_mean_curve_keeps_the_steps_every_seed_evaluated() -> None:
    runs = [_run(0, "TRL", 96.0, [(0, 0.0, 0.4), (20, 10.0, 0.6), (40, 20.0, 0.7)]), _run(1, "TRL", 96.0, [(0, 0.0, 0.2), (20, 14.0, 0.5)])]
    assert peer.mean_curves(runs, "TRL") == [{"step": 0, "s": 0.0, "accuracy": pytest.approx(0.3)},
                                            {"step": 20, "s": 12.0, "accuracy": pytest.approx(0.55)}]


def test_trl_split_takes_per_step_differences_of_the_cumulative_clock() -> None:
    per_step = [{"step": 1, "train_s": 1.0, "generate_s": 0.5, "env_s": 0.1},
                {"step": 2, "train_s": 3.0, "generate_s": 1.7, "env_s": 0.3},
                {"step": 3, "train_s": 4.2, "generate_s": 2.3, "env_s": 0.4}]
    split = peer.trl_split(per_step)  # steps 1.0, 2.0, 1.2; generate 0.5, 1.2, 0.6; env 0.1, 0.2, 0.1
    assert split["step"] == pytest.approx(1.2) and split["HF generate"] == pytest.approx(0.6)
    assert split["environment (sandbox)"] == pytest.approx(0.1)
    assert split["rest (loss, backward, optimiser, TRL)"] == pytest.approx(0.5)  # 0.4, 0.6, 0.5


def _agentrl_records() -> list[dict]:
    return [
        {"kind": "eval", "time": 5.0, "version": 0, "eval_s": 4.0, "accuracy": 0.3},
        {"kind": "event", "time": 6.0, "loop_start": True, "message": "RL loop started at version 0"},
        {"kind": "step", "time": 8.0, "step": 1, "train_s": 1.0, "publish_s": 0.2, "update_stall_s": 0.1, "learner_busy_s": 1.5},
        {"kind": "step", "time": 10.0, "step": 2, "train_s": 1.2, "publish_s": 0.3, "update_stall_s": 0.1, "learner_busy_s": 1.8},
        {"kind": "eval", "time": 16.0, "version": 2, "eval_s": 5.0, "accuracy": 0.5},
        {"kind": "step", "time": 18.0, "step": 3, "train_s": 1.1, "publish_s": 0.2, "update_stall_s": 0.3, "learner_busy_s": 1.6},
        {"kind": "utilisation", "time": 19.0, "rl_wall_s": 13.0, "generator_busy_fraction": 0.9, "learner_busy_fraction": 0.4},
        {"kind": "event", "time": 19.5, "message": "checkpoint step_3 (0.4 s)"},
        {"kind": "eval", "time": 25.0, "version": 3, "eval_s": 5.0, "accuracy": 0.6},  # the final one: after the loop
    ]


def test_agentrl_rl_clock_takes_out_only_the_evaluations_inside_the_loop() -> None:
    rl_s, steps = peer.agentrl_rl_s(_agentrl_records())
    assert rl_s == pytest.approx(13.0 - 5.0) and steps == 3


def test_agentrl_split_reads_the_logged_step_fields_and_leaves_evaluations_out_of_the_interval() -> None:
    split = peer.agentrl_split(_agentrl_records())
    # intervals 6->8, 8->10, 10->18 minus the 5 s evaluation: 2, 2, 3
    assert split["step"] == pytest.approx(2.0)
    assert split["learner train"] == pytest.approx(1.1) and split["publish weights"] == pytest.approx(0.2)
    assert split["generator update stall"] == pytest.approx(0.1)
    assert split["rest: episodes (generation, sandbox), waiting"] == pytest.approx(0.5)  # 2-1.5, 2-1.8, 3-1.6
    assert "handover (generator sleep, colocated)" not in split and "batch transfer" not in split  # not logged: not invented
    assert split["generator busy"] == 0.9 and split["learner busy"] == 0.4


def test_sides_alternate_and_seeds_parse() -> None:
    assert [peer.order(i)[0] for i in range(4)] == ["TRL", "agentrl", "TRL", "agentrl"]
    assert peer.parse_seeds("0, 1,2") == [0, 1, 2]
    for bad in ("0,0", "", "a"):
        with pytest.raises(ValueError):
            peer.parse_seeds(bad)


def test_reuse_reads_a_finished_run_only_when_it_was_run_with_the_same_settings(tmp_path: Path) -> None:
    import argparse
    import json

    args = argparse.Namespace(steps=120, save_every=20, no_eval=False, sft="runs/tiny_calc/sft", reuse=True)
    (tmp_path / "trl.bench.json").write_text(json.dumps({"command_s": 1.0, "steps": 120, "save_every": 20, "no_eval": False,
                                                         "sft": "runs/tiny_calc/sft"}))
    assert peer.ensure_run(args, "TRL", 0, tmp_path, first=True) is False  # read, not run
    (tmp_path / "trl.bench.json").write_text(json.dumps({"command_s": 1.0, "steps": 2, "save_every": 2, "no_eval": False,
                                                         "sft": "runs/tiny_calc/sft"}))
    with pytest.raises(SystemExit, match="other settings"):  # a 2-step smoke is never read as a 120-step run
        peer.ensure_run(args, "TRL", 0, tmp_path, first=True)
