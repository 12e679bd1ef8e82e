"""PPO with a learned critic and an LLM judge for real: Ray, vLLM (CPU), the learner's and the
critic's FSDP2 ranks (gloo), bubblewrap. ``recipes/tiny_calc_judge.toml``: the policy's vLLM
generator judges its own training episodes (structured output "Score: N"), the reward is
1.0 * env + 0.1 * judge; checkpoints hold the critic and a resume puts it back. (One run covers
both, to spend one engine start-up.)"""

import json
import subprocess

import pytest

from agentrl.cli import train_command
from tests.e2e.helpers import REPO
from tests.e2e.test_train_e2e import SMALL_RUN

PPO = ('algo.advantage="gae"', "critic.warmup_steps=1", "critic.lr=1e-3", "checkpoint.every_steps=2", *SMALL_RUN)


def judged_ppo(run_dir, model, *overrides):
    return train_command(str(REPO / "recipes" / "tiny_calc_judge.toml"), str(run_dir), str(model), *overrides, *PPO)


def steps_of(run_dir):
    return [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "step"]


@pytest.mark.e2e
@pytest.mark.vllm
def test_ppo_with_a_critic_and_a_policy_judge_trains_checkpoints_and_resumes(tmp_path, tiny_calc_model):
    run_dir = tmp_path / "run"
    first = subprocess.run(judged_ppo(run_dir, tiny_calc_model, "learner.max_steps=3"), cwd=REPO,
                           capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    steps = steps_of(run_dir)
    assert [s["version"] for s in steps] == [1, 2, 3]
    # warm-up: the first step trains the critic alone, the policy's version still advances
    assert steps[0].get("policy_held") == 1.0 and steps[0]["trained_tokens"] == 0.0
    assert all("policy_held" not in s and s["trained_tokens"] > 0 for s in steps[1:])
    assert all(s["value_tokens"] > 0 and s["value_mse"] >= 0 and "value_explained_variance" in s for s in steps)
    for s in steps:  # the judge: the constrained answer always parses; its score joins the reward by weight
        assert s["reward_failures_batch"] == 0
        assert 0.0 <= s["judge_score_mean"] <= 1.0
        assert s["reward_mean"] == pytest.approx(s["env_reward_mean"] + 0.1 * s["judge_score_mean"])
    ckpt = run_dir / "checkpoints" / "step_000002"
    assert json.loads((ckpt / "critic" / "trainer_state.json").read_text())["step"] == 2

    # the same command, further: resumes from step 2 with the critic's state (its step counter goes on)
    second = subprocess.run(judged_ppo(run_dir, tiny_calc_model, "learner.max_steps=5"), cwd=REPO,
                            capture_output=True, text=True, timeout=900)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert [s["version"] for s in steps_of(run_dir)] == [1, 2, 3, 4, 5]
    assert json.loads((run_dir / "checkpoints" / "step_000004" / "critic" / "trainer_state.json").read_text())["step"] == 4
