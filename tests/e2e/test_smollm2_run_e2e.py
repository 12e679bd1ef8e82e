"""``agentrl train recipes/smol_calc.toml`` on SmolLM2-135M-Instruct (the real pretrained model,
tied embeddings) trains every step with checkpoints and prunes its published versions; then
``agentrl export`` of the last checkpoint, served by vLLM's OpenAI server, answers a chat
completion and stops at the end of its turn (the generation config's EOS).

SIGKILL mid-run and resume are checked on the tiny model, by the append-only audit
(test_resume_e2e.py; test_ppo_e2e.py and test_lora_e2e.py resume the critic and adapters): a
kill and a second start-up of SmolLM2 here cost about two minutes and checked less."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest

from agentrl.cli import train_command
from tests.e2e.helpers import REPO, steps, vllm_server

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]


def _cmd(run_dir, model) -> list[str]:
    return train_command(
        str(REPO / "recipes" / "smol_calc.toml"), str(run_dir), str(model),
        "sft.steps=0", "eval.limit=0", "learner.max_steps=4", "learner.batch_size=8",
        "rollout.max_new_tokens=16", "rollout.max_concurrent_episodes=8",
        "checkpoint.every_steps=1", "checkpoint.keep=1",
    )


def test_smollm2_trains_exports_and_serves(tmp_path, smol_model) -> None:
    run_dir = tmp_path / "run"
    env = {**os.environ, "RAY_DEDUP_LOGS": "0"}
    run = subprocess.run(_cmd(run_dir, smol_model), cwd=REPO, capture_output=True, text=True, timeout=900, env=env)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-5000:]
    assert steps(run_dir) == [1, 2, 3, 4]
    trained = [json.loads(line) for line in (run_dir / "trained.jsonl").read_text().splitlines()]
    prompts = [p for t in trained for p in t["prompts"]]
    assert len(prompts) == len(set(prompts)), f"a prompt was trained twice: {prompts}"
    # published versions are pruned: SmolLM2's 538 MB per version must not pile up
    assert len(list((run_dir / "weights").glob("v*"))) <= 3  # learner.keep_versions

    checkpoint = max((run_dir / "checkpoints").glob("step_*"))
    out = tmp_path / "exported"
    r = subprocess.run([sys.executable, "-m", "agentrl.cli", "export", str(checkpoint), str(out)], cwd=REPO,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    gen_config = json.loads((out / "generation_config.json").read_text())
    assert 2 in (gen_config["eos_token_id"] if isinstance(gen_config["eos_token_id"], list) else [gen_config["eos_token_id"]])

    with vllm_server(out, tmp_path / "server.log", "--dtype", "float32", "--max-model-len", "1024",
                     "--served-model-name", "smol") as base:
        reply = httpx.post(f"{base}/v1/chat/completions", timeout=120, json={
            "model": "smol", "messages": [{"role": "user", "content": "Say hello in three words."}],
            "max_tokens": 200, "temperature": 0.0,
        })
    assert reply.status_code == 200, reply.text
    choice = reply.json()["choices"][0]
    print("exported SmolLM2 answers:", choice)
    assert choice["message"]["content"].strip()
    assert choice["finish_reason"] == "stop"  # it stopped at <|im_end|>, not at max_tokens
    assert "<|im_end|>" not in choice["message"]["content"] and "<|im_start|>" not in choice["message"]["content"]
