"""benchmarks/gpu_colocated_check.py: its verdicts on the H100's record and on broken variants of
it, and the whole script on this CPU with a small model (real Ray; no GPU, so no IPC and no
memory figures)."""

from __future__ import annotations

import copy
import json

import pytest

from tests.benchmarks import BENCH, benchmark_module, run_gpu_check_on_cpu

RECORD = BENCH / "records" / "gpu" / "h100_colocated_qwen1.5b_r1.json"


@pytest.fixture(scope="module")
def check():
    with benchmark_module("gpu_colocated_check") as mod:
        yield mod


@pytest.fixture
def h100() -> dict:
    return json.loads(RECORD.read_text())


def test_the_h100_run_passes_every_check(check, h100):
    verdict = check.verdict(h100)
    assert set(verdict) == {"cpu actor picks the CPU", "steps trained", "same GPU for learner and neighbour",
                            "ipc handover exact", "offload frees the GPU for the neighbour"}
    assert all(v["ok"] for v in verdict.values()), verdict


def test_a_neighbour_on_another_gpu_fails(check, h100):
    broken = copy.deepcopy(h100)
    broken["neighbour_before"]["uuid"] = "another-gpu"
    assert not check.verdict(broken)["same GPU for learner and neighbour"]["ok"]


def test_a_handover_that_changed_the_tensor_fails(check, h100):
    broken = copy.deepcopy(h100)
    broken["ipc"]["received"]["sum"] += 1e-3
    assert not check.verdict(broken)["ipc handover exact"]["ok"]
    broken["ipc"]["received"] = {"error": "no handle for this GPU"}
    assert not check.verdict(broken)["ipc handover exact"]["ok"]


def test_an_offload_the_neighbour_cannot_see_fails(check, h100):
    broken = copy.deepcopy(h100)
    broken["offload_states"]["neighbour"]["device_used_gib"] = broken["after_step"]["neighbour"]["device_used_gib"] - 0.5
    assert not check.verdict(broken)["offload frees the GPU for the neighbour"]["ok"]


def test_a_cpu_actor_on_the_gpu_fails(check, h100):
    broken = copy.deepcopy(h100)
    broken["cpu_actor"]["on_gpu"] = True
    assert not check.verdict(broken)["cpu actor picks the CPU"]["ok"]


@pytest.mark.ray
def test_the_script_runs_on_this_cpu_with_a_small_model(tmp_path):
    proc, report = run_gpu_check_on_cpu("gpu_colocated_check", tmp_path)
    assert report["learner"]["device"] == "cpu" and report["setup"]["backend"] == "gloo"
    assert [s["loss"] is not None for s in report["steps"]] == [True, True]
    assert "ipc" not in report and set(report["verdict"]) == {"cpu actor picks the CPU", "steps trained"}
    assert "ok   steps trained" in proc.stdout
