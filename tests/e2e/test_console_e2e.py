"""A healthy `agentrl train` keeps the console for agentrl: vLLM's, Ray's and transformers' output
goes to RUN_DIR/logs/, one file per actor."""

import os
import subprocess

import pytest

from tests.e2e.helpers import REPO, train_cmd

NOISE = (
    "Loading safetensors checkpoint shards",  # vLLM's progress bar at every weight reload
    "RotaryEmbedding: Failed to load weights",  # vLLM's misleading reload warning (agentrl.engine.vllm_worker)
    "Token authentication is enabled",  # Ray's warning when it picks the auth mode itself
    "pid=",  # any line Ray forwards from an actor: "(VllmGenerator pid=123) ..."
    "WARNING",
    "INFO",
)


@pytest.mark.e2e
@pytest.mark.vllm
def test_a_short_run_prints_only_agentrl_lines_and_logs_the_actors_to_files(tmp_path, tiny_calc_model):
    run_dir = tmp_path / "run"
    cmd = train_cmd(
        run_dir, tiny_calc_model, "sft.steps=0", "eval.limit=8", "eval.every_steps=0", "learner.max_steps=3",
        "learner.batch_size=8", "rollout.max_new_tokens=16", "learner.max_degenerate_steps=0",
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}  # as on a fresh shell
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900, env=env)
    console = proc.stdout + proc.stderr
    assert proc.returncode == 0, console[-6000:]
    noisy = [line for line in console.splitlines() if any(n in line for n in NOISE)]
    assert noisy == [], "\n".join(noisy[:20])
    assert "done: 3 steps" in console and "eval v0" in console
    logs = {p.name: p.read_text(errors="replace") for p in (run_dir / "logs").iterdir()}
    assert {"generator-0.log", "learner-0.log", "rollout-0.log"} <= set(logs)
    assert "vLLM" in logs["generator-0.log"] or "vllm" in logs["generator-0.log"]  # the engine's own lines went here
    assert "RotaryEmbedding: Failed to load weights" not in logs["generator-0.log"]  # explained and dropped at its root
