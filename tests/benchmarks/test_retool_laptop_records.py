"""benchmarks/retool_laptop.py keeps each finished run's result in a small record in git, and
``--reuse`` reads it where the run directory is gone (a fresh machine)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmarks import benchmark_module



@pytest.fixture
def bench(tmp_path, monkeypatch):
    """The benchmark module, its records in ``tmp_path/records`` and ``agentrl train`` forbidden."""
    with benchmark_module("retool_laptop") as mod:
        monkeypatch.setattr(mod, "RECORDS", tmp_path / "records")

        def no_training(*a, **k):
            raise AssertionError("agentrl train was started for a run that has a record")

        monkeypatch.setattr(mod, "agentrl_train", no_training)
        yield mod


CURVE = [{"version": 0, "rl_s": 0.0, "accuracy": 0.25, "ood/accuracy": 0.125, "tool_call_rate": 0.5},
         {"version": 30, "rl_s": 2585.0, "accuracy": 0.75, "ood/accuracy": 0.375, "tool_call_rate": 1.0}]


def test_a_record_round_trips_and_names_its_commit(bench, tmp_path):
    path = bench.RECORDS / "tool_s0.json"
    bench.write_record(path, "tool", 0, {"curve": CURVE, "command_s": 4147.0, "run_dir": tmp_path / "runs" / "tool_s0"})
    stored = json.loads(path.read_text())
    assert stored["recipe"] == "recipes/smol_retool.toml" and stored["seed"] == 0
    assert len(stored["commit"]) == 40  # the commit that ran it
    back = bench.read_record(path)
    assert back["curve"] == CURVE and back["command_s"] == 4147.0 and back["run_dir"] == tmp_path / "runs" / "tool_s0"


def test_reuse_reads_the_record_when_the_run_directory_is_gone(bench, tmp_path):
    bench.write_record(bench.RECORDS / "text_s1.json", "text", 1, {"curve": CURVE, "command_s": 2208.0, "run_dir": Path("/gone")})
    got = bench.run_arm("text", 1, tmp_path / "runs", [], reuse=True)
    assert got["curve"] == CURVE and got["command_s"] == 2208.0


def test_a_run_directory_wins_over_the_record_and_refreshes_it(bench, tmp_path):
    bench.write_record(bench.RECORDS / "tool_s0.json", "tool", 0, {"curve": CURVE, "command_s": 1.0, "run_dir": Path("/old")})
    run_dir = tmp_path / "runs" / "tool_s0"
    run_dir.mkdir(parents=True)
    (run_dir / "summary.json").write_text("{}")
    (run_dir / "command_s.txt").write_text("99.0\n")
    lines = [{"time": 100.0, "loop_start": True}, {"kind": "eval", "version": 0, "time": 100.0, "accuracy": 0.5}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    got = bench.run_arm("tool", 0, tmp_path / "runs", [], reuse=True)
    assert got["command_s"] == 99.0 and got["curve"][0]["accuracy"] == 0.5
    assert json.loads((bench.RECORDS / "tool_s0.json").read_text())["command_s"] == 99.0


def test_runs_with_overrides_neither_read_nor_write_records(bench, tmp_path):
    bench.write_record(bench.RECORDS / "tool_s0.json", "tool", 0, {"curve": CURVE, "command_s": 1.0, "run_dir": Path("/old")})
    with pytest.raises(AssertionError, match="agentrl train was started"):
        bench.run_arm("tool", 0, tmp_path / "runs", ["learner.max_steps=2"], reuse=True)


def test_a_broken_record_is_named(bench):
    path = bench.RECORDS / "tool_s0.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"arm": "tool", "curve": []}))
    with pytest.raises(SystemExit, match="tool_s0.json"):
        bench.read_record(path)
