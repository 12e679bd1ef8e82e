"""benchmarks/gpu_learner_check.py: its verdicts on the H100's records and on broken variants of
them, and the whole script on this CPU with a small model (the offload is a no-op here)."""

from __future__ import annotations

import copy
import json

import pytest

from tests.benchmarks import BENCH, benchmark_module, run_gpu_check_on_cpu

RECORDS = BENCH / "records" / "gpu"


@pytest.fixture(scope="module")
def check():
    with benchmark_module("gpu_learner_check") as mod:
        yield mod


@pytest.fixture
def h100() -> dict:
    return json.loads((RECORDS / "h100_qwen1.5b_full_r2_per_layer.json").read_text())


def test_the_h100_run_after_the_fixes_passes_every_check(check, h100):
    verdict = check.verdict(h100)
    assert set(verdict) == {"backend", "memory", "offload_frees", "round_trip_exact", "matches_plain", "publish"}
    assert all(v["ok"] for v in verdict.values()), verdict


def test_memory_left_on_the_gpu_after_an_offload_fails(check, h100):
    broken = copy.deepcopy(h100)
    broken["offload"]["cycles"][1]["allocated_gib"] = 11.5  # the moments stayed behind
    assert not check.verdict(broken)["offload_frees"]["ok"]


@pytest.mark.parametrize("key", ["same_parameter_objects", "parameters_equal", "moments_equal", "logprobs_equal_after_reload"])
def test_a_round_trip_that_changes_anything_fails(check, h100, key):
    broken = copy.deepcopy(h100)
    broken["offload"][key] = False
    assert not check.verdict(broken)["round_trip_exact"]["ok"]


def test_a_step_after_offload_that_drifts_from_the_twin_fails(check, h100):
    broken = copy.deepcopy(h100)
    broken["offload"]["step2"]["loss"] = h100["plain"]["step2"]["loss"] * 1.05
    assert not check.verdict(broken)["matches_plain"]["ok"]


def test_a_peak_beyond_what_vllm_leaves_fails(check, h100):
    broken = copy.deepcopy(h100)
    broken["offload"]["step1_peak_allocated_gib"] = h100["device_gib"] - h100["plan"]["generator_gib"] + 1.0
    assert not check.verdict(broken)["memory"]["ok"]


def test_the_script_runs_on_this_cpu_with_a_small_model(tmp_path):
    proc, report = run_gpu_check_on_cpu("gpu_learner_check", tmp_path, "--probe", "2")
    assert report["offload"]["setup"]["backend"] == "gloo" and report["plain"]["step2"]["trained_tokens"] > 0
    assert report["verdict"]["round_trip_exact"]["ok"] and report["verdict"]["matches_plain"]["ok"]
    assert "ok   round_trip_exact" in proc.stdout
