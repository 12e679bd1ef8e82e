"""Learning, end to end: a real `agentrl train` run moves the policy in the rewarded direction.

The task rewards an answer whose first character is a digit. What RL should change is then one
number that needs no sampling to measure: the probability the policy gives, at the first
generated position, to tokens that start with a digit, averaged over held-out prompts, computed
exactly from the weights before and after the run. It can only rise well beyond noise if the
advantages reach the generated tokens with the right sign (a flipped sign lowers it, a lost
advantage leaves it where it was); the run is async with max_staleness 1, so tokens from stale
versions are in the loss.
"""

import json
import os
import subprocess

import pytest
import torch

from agentrl.engine.episodes.render import IncrementalRenderer
from agentrl.envs.data import load_rows
from tests.e2e.direction_env import rewarded
from tests.e2e.helpers import REPO, train_cmd

STEPS = 8


def _rewarded_mass(model_dir, questions: list[str]) -> float:
    """Mean over ``questions`` of the probability of a rewarded first token."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    good = torch.tensor([rewarded(tok.decode([i])) for i in range(len(tok))] + [False] * (model.config.vocab_size - len(tok)))
    assert 0 < good.sum() < len(good)
    masses = []
    with torch.no_grad():
        for q in questions:
            ids = IncrementalRenderer(tok, [{"role": "user", "content": q}]).prompt_ids()  # as the rollout renders it
            probs = model(torch.tensor([ids])).logits[0, -1].softmax(-1)
            masses.append(float(probs[good].sum()))
    return sum(masses) / len(masses)


@pytest.mark.e2e
@pytest.mark.vllm
def test_rl_moves_the_policy_toward_the_reward(tmp_path, tiny_calc_model):
    run_dir = tmp_path / "run"
    cmd = train_cmd(
        run_dir, tiny_calc_model,
        "env.id='tests.e2e.direction_env:DigitFirstEnv'",
        "env.kwargs={}",
        "sft.steps=0",
        "eval.limit=0",
        f"learner.max_steps={STEPS}",
        "learner.batch_size=32",
        "learner.lr=3e-3",
        "rollout.group_size=8",
        "rollout.max_new_tokens=2",
        "data.limit=256",
    )
    env = {**os.environ, "RAY_DEDUP_LOGS": "0", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]

    held_out = [row["question"] for row in load_rows("synthetic:calc", limit=1024)[-64:]]
    before = _rewarded_mass(tiny_calc_model, held_out)
    after = _rewarded_mass(run_dir / "final", held_out)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rewards = [r["reward_mean"] for r in records if r["kind"] == "step"]
    print(f"rewarded first-token mass {before:.3f} -> {after:.3f}; reward per step {rewards}")
    assert len(rewards) == STEPS
    assert after > before + 0.15 and after > 4 * before, (before, after, rewards)
