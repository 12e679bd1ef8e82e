"""``agentrl train recipes/smol_retool.toml``, reduced, on SmolLM2-135M-Instruct (the real
pretrained model, tied embeddings): a short SFT warm-up on the tool-integrated math
demonstrations (8 steps of 4 conversations), then two RL steps of ``agentrl/MathTool-v0`` on systems of
two equations (``synthetic:system``, whose demonstrated solution imports sympy in the sandbox).
The run trains every step with checkpoints, prunes its published versions, runs sympy in the
sandbox, and evaluates in distribution and out of it (``eval.sets.ood``) with ReTool's
measurements of tool use, which ``agentrl report`` shows. Then ``agentrl export`` of the last
checkpoint, served by vLLM's OpenAI server, answers a chat completion and stops at the end of its
turn (the generation config's EOS). One SmolLM2 run checks all of it: a second start-up costs
about two minutes.

SIGKILL mid-run and resume are checked on the tiny model, by the append-only audit
(test_resume_e2e.py; test_ppo_e2e.py and test_lora_e2e.py resume the critic and adapters). The
full comparison of the tool recipe with the text-only one is ``benchmarks/retool_laptop.py``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import httpx
import pytest

from agentrl.cli import train_command
from tests.e2e.helpers import REPO, steps, vllm_server

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]

TOOL_USE = ("tool_call_rate", "tool_calls_mean", "tool_error_rate", "tool_error_episodes", "recovery_rate", "response_tokens_mean")


def _cmd(run_dir, model) -> list[str]:
    return train_command(
        str(REPO / "recipes" / "smol_retool.toml"), str(run_dir), str(model),
        'data.source="synthetic:system"', "sft.steps=8", "sft.batch_size=4", "sft.lr=2e-4", "sft.num_examples=64",
        "learner.max_steps=2", "learner.keep_versions=2", "learner.batch_size=8", "rollout.max_concurrent_episodes=8",
        "eval.limit=4", "eval.sets.ood.limit=2", "eval.every_steps=0", "eval.samples=4",
        "checkpoint.every_steps=1", "checkpoint.keep=1",
    )


def _texts(path) -> list[str]:
    return [json.loads(line)["text"] for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def test_smollm2_retool_trains_with_sympy_reports_tool_use_exports_and_serves(tmp_path, smol_model) -> None:
    run_dir = tmp_path / "run"
    env = {**os.environ, "RAY_DEDUP_LOGS": "0"}
    run = subprocess.run(_cmd(run_dir, smol_model), cwd=REPO, capture_output=True, text=True, timeout=1500, env=env)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-5000:]
    assert steps(run_dir) == [1, 2]
    trained = [json.loads(line) for line in (run_dir / "trained.jsonl").read_text().splitlines()]
    prompts = [p for t in trained for p in t["prompts"]]
    assert len(prompts) == len(set(prompts)), f"a prompt was trained twice: {prompts}"
    # published versions are pruned: SmolLM2's 538 MB per version must not pile up (v0..v2 written)
    assert len(list((run_dir / "weights").glob("v*"))) <= 2  # learner.keep_versions

    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    # placement.mode = "auto" on one machine without GPUs: colocated (generation and training take turns), and it
    # trains, publishes and evaluates so
    events = [e["message"] for e in records if e["kind"] == "event"]
    assert any(m.startswith("placement: colocated (auto") for m in events), events[:8]
    evals = [e for e in records if e["kind"] == "eval"]
    assert [e["version"] for e in evals] == [0, 2]
    for e in evals:
        assert e["episodes"] == 4 and e["ood/episodes"] == 2, e
        assert all(k in e and f"ood/{k}" in e for k in TOOL_USE), sorted(e)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert "ood/accuracy" in summary["eval_after"] and "recovery_rate" in summary["eval_after"]

    # sympy ran in the sandbox: a code block that imports it came back with a value, not an error
    ran = [m for t in _texts(run_dir / "samples.jsonl") + _texts(run_dir / "eval_samples.jsonl")
           for m in re.finditer(r"<code>(.*?)</code>.*?<interpreter>\n?(.*?)</interpreter>", t, re.S)
           if "sympy" in m.group(1)]
    assert ran, "no episode ran a code block that imports sympy"
    assert any(out.strip() and "Error" not in out for _, out in (m.groups() for m in ran)), [m.group(2) for m in ran][:5]

    r = subprocess.run([sys.executable, "-m", "agentrl.cli", "report", str(run_dir)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    md = (run_dir / "report" / "summary.md").read_text()
    assert "| ood accuracy |" in md and "| recovery rate |" in md and "code error rate" in md, md
    assert "Held-out accuracy gain on `ood`" in md
    page = (run_dir / "report" / "index.html").read_text()
    assert "tool use at each evaluation" in page and "held-out accuracy (ood)" in page

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
