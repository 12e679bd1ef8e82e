"""`agentrl train recipes/tiny_calc_judge.toml` for real: the policy's vLLM generator judges its
own training episodes (structured output "Score: N"), the reward is 1.0 * env + 0.1 * judge."""

import json
import os
import subprocess

import pytest

from agentrl.cli import train_command
from tests.e2e.helpers import REPO
from tests.e2e.test_train_e2e import SMALL_RUN


@pytest.mark.e2e
@pytest.mark.vllm
def test_two_steps_with_a_policy_judge(tmp_path, tiny_calc_model):
    run_dir = tmp_path / "run"
    cmd = train_command(str(REPO / "recipes" / "tiny_calc_judge.toml"), str(run_dir), str(tiny_calc_model), "learner.max_steps=2", *SMALL_RUN)
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900, env={**os.environ, "RAY_DEDUP_LOGS": "0"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    steps = [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "step"]
    assert [s["version"] for s in steps] == [1, 2]
    for s in steps:
        assert s["reward_failures_batch"] == 0  # the constrained judge always answers a score
        assert 0.0 <= s["judge_score_mean"] <= 1.0
        assert s["reward_mean"] == pytest.approx(s["env_reward_mean"] + 0.1 * s["judge_score_mean"])
