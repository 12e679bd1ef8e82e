"""`agentrl train` with an OpenAI-SDK agent for real: vLLM behind the gateway, the agent's tool in
the bubblewrap sandbox, Ray actors and the FSDP2 learner, a few steps."""

import json
import os
import subprocess

import pytest

from agentrl.cli import train_command
from tests.e2e.helpers import REPO


@pytest.mark.e2e
@pytest.mark.vllm
def test_an_agent_program_trains_end_to_end(tmp_path, tiny_calc_model):
    run_dir = tmp_path / "run"
    cmd = train_command(
        str(REPO / "recipes" / "tiny_agent.toml"), str(run_dir), str(tiny_calc_model),
        "env.agent='tests.e2e.digit_agent:digit_agent'", "sft.steps=0", "eval.limit=8", "eval.every_steps=0",
        "data.limit=96", "learner.max_steps=3", "learner.batch_size=16", "rollout.group_size=4", "learner.lr=1e-2",
    )
    env = {**os.environ, "RAY_DEDUP_LOGS": "0", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["kind"] == "step"]
    assert [s["version"] for s in steps] == [1, 2, 3]
    assert all(s["agent_failures"] == 0 and s["infra_failures"] == 0 for s in steps)
    assert all(s["turns_mean"] == 2.0 for s in steps)  # both calls of every episode reached vLLM
    assert max(s["max_token_version"] for s in steps) >= 1  # tokens of published versions were trained
    assert sum(s["trained_tokens"] for s in steps) > 0
    evals = [r for r in records if r["kind"] == "eval"]
    assert len(evals) == 2 and all(e["infra_failures"] == 0 for e in evals)
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert samples and all("tool says 100" in s["text"] for s in samples if s["text"])  # the sandbox ran
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["agent_failures"] == 0 and summary["samples_trained"] == 48
