"""Colocated (``placement.mode = "auto"`` on this CPU-only machine: the async machinery with
generation and training taking turns, each with every core) trains exactly what ``sync`` with
separate placement trains: same seed, same samples, same parameters (real Ray, vLLM, FSDP2 and
bubblewrap; sampling is seeded per episode and turn). Both start from one SFT warm-up: the sync
run's own, which the colocated run takes as its model with ``sft.steps=0`` (the RL steps are
compared; one warm-up instead of two). After every hand-over the learner's log-probs of the
tokens it trains equal vLLM's."""

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.e2e.helpers import REPO, train_cmd


def _train(run_dir: Path, model: Path, mode: str, sft_steps: int) -> None:
    cmd = train_cmd(
        run_dir, model,
        # the colocated run binds vLLM's OpenMP threads as a recipe without the key does there ("all")
        *(["mode=sync", "placement.mode=separate"] if mode == "sync"
          else ["mode=async", "placement.mode=auto", 'generator.cpu_threads_bind="all"']),
        "algo.max_staleness=0",
        # a short warm-up (30 steps, in the sync run) so that episodes differ in length, and a
        # length penalty so that rewards differ within a group: the RL steps then move the parameters
        f"sft.steps={sft_steps}",
        "algo.overlong_max_tokens=24",
        "algo.overlong_buffer_tokens=20",
        "learner.max_steps=2",
        "learner.batch_size=8",
        "rollout.group_size=4",
        "rollout.max_new_tokens=24",
        "data.limit=64",
        "eval.limit=0",
    )
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def _trained(run_dir: Path) -> list[list[int]]:
    return [sorted(json.loads(line)["prompts"]) for line in (run_dir / "trained.jsonl").read_text().splitlines()]


@pytest.mark.e2e
@pytest.mark.vllm
def test_colocated_trains_exactly_what_sync_trains(tmp_path, tiny_calc_model):
    runs = {mode: tmp_path / mode for mode in ("sync", "async")}
    _train(runs["sync"], tiny_calc_model, "sync", sft_steps=30)
    _train(runs["async"], runs["sync"] / "sft", "async", sft_steps=0)  # the same start: the sync run's warm-up

    assert json.loads((runs["async"] / "recipe.json").read_text())["model"]["path"] == str(runs["sync"] / "sft")
    assert not (runs["async"] / "sft").exists()  # no warm-up of its own
    assert _trained(runs["sync"]) == _trained(runs["async"]) == [[0, 1], [2, 3]]
    sft = _weights(runs["sync"] / "sft")
    final = {mode: _weights(run_dir / "final") for mode, run_dir in runs.items()}
    assert final["async"].keys() == sft.keys()
    moved = max((final["sync"][k] - sft[k]).abs().max().item() for k in sft)
    assert moved > 1e-4, "the RL steps did not change the parameters: the comparison would be empty"
    # Same samples, same order, same losses; what remains is vLLM's behaviour log-probs, which
    # vary at ~1e-7 with its batch composition and enter the loss through the importance
    # weights; Adam's first steps magnify that to ~2e-6 on a ~2e-4 update. Training on
    # different samples would differ by the size of the update itself.
    diff = max((final["async"][k] - final["sync"][k]).abs().max().item() for k in sft)
    assert diff < 0.05 * moved, (diff, moved)
    steps = {
        mode: [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "step"]
        for mode, run_dir in runs.items()
    }
    for a, b in zip(steps["sync"], steps["async"], strict=True):
        assert a["staleness_hist"] == b["staleness_hist"] == {"0": 8}
        assert a["trained_tokens"] == b["trained_tokens"]
        assert abs(a["loss"] - b["loss"]) < 1e-6, (a["loss"], b["loss"])
        # the hand-over: every trained token was sampled by the weights the learner held, and the
        # learner's log-prob of it equals vLLM's (float32 both sides)
        assert b["current_version_tokens"] == b["trained_tokens"] and b["logprob_abs_diff_current"] < 1e-4, b
    placed = {mode: next(r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r.get("placement"))
              for mode, run_dir in runs.items()}
    assert placed["sync"]["placement"] == "separate" and placed["async"]["placement"] == "colocated", placed
    assert "one machine without GPUs" in placed["async"]["placement_reason"]
    recipe = json.loads((runs["async"] / "recipe.json").read_text())  # what the run did: every core to each phase
    assert recipe["placement"]["mode"] == "colocated" and recipe["learner"]["torch_threads"] == len(os.sched_getaffinity(0))
    # "all" reached vLLM as the cores the generator may use (vLLM itself reads no "all": an engine
    # given it does not start)
    ready = next(r for r in map(json.loads, (runs["async"] / "metrics.jsonl").read_text().splitlines()) if r.get("generators"))
    assert [g["cpu_threads_bind"] for g in ready["generators"]] == [",".join(map(str, sorted(os.sched_getaffinity(0))))], ready
