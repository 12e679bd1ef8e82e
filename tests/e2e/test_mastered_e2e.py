"""A mastered task ends the run as a success (issue 39): a real `agentrl train` with
``algo.dynamic_sampling = "refill"`` on a task the warmed-up model solves stops early with exit
status 0, a final model, a final evaluation and the words "the model solves N of N training
prompts".

The task is test_learning_e2e's (an answer that starts with a digit earns 1.0); the run's SFT
stage teaches the tiny model to answer with a digit, so that almost every group it samples is
all-correct: the refill budget then finds no group with a learning signal, every one solved.
"""

import json
import os
import re
import subprocess

import pytest

from agentrl.engine.common.audit import read_audit, set_aside_audit_path
from agentrl.envs.data import load_rows
from tests.e2e.direction_env import rewarded
from tests.e2e.helpers import REPO, train_cmd

MAX_STEPS = 30


@pytest.mark.e2e
@pytest.mark.vllm
def test_a_task_the_sft_model_solves_ends_early_with_exit_0_and_a_final_model(tmp_path, tiny_calc_model):
    demos = tmp_path / "digits.jsonl"  # "Compute 3+4." -> "7": the answer starts with a digit
    with demos.open("w") as f:
        for row in load_rows("synthetic:calc", limit=256, seed=1):
            f.write(json.dumps({"messages": [{"role": "user", "content": row["question"]},
                                             {"role": "assistant", "content": str(row["answer"])}]}) + "\n")
    run_dir = tmp_path / "run"
    cmd = train_cmd(
        run_dir, tiny_calc_model,
        "env.id='tests.e2e.direction_env:DigitFirstEnv'", "env.kwargs={}",
        f"sft.source='{demos}'", "sft.steps=40", "sft.batch_size=32", "sft.num_examples=256",
        "algo.dynamic_sampling='refill'", "algo.max_sampling_factor=2.0",
        f"learner.max_steps={MAX_STEPS}", "learner.batch_size=16", "rollout.group_size=4", "rollout.max_new_tokens=2",
        "data.limit=256", "eval.limit=16", "eval.every_steps=0", "learner.max_degenerate_steps=0",
    )
    env = {**os.environ, "RAY_DEDUP_LOGS": "0", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    said = re.search(r"ended early: the model solves (\d+) of (\d+) training prompts sampled for step (\d+)", proc.stdout)
    assert said and said.group(1) == said.group(2), proc.stdout[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] < MAX_STEPS and int(said.group(3)) == summary["steps"] + 1
    assert summary["ended_early"].startswith(f"the model solves {said.group(1)} of")
    assert (run_dir / "final" / "model.safetensors").is_file() and (run_dir / "final" / "tokenizer_config.json").is_file()
    # the final evaluation ran on the final model, after the one before RL
    assert [e["version"] for e in (summary["eval_before"], summary["eval_after"])] == [0, summary["steps"]]
    assert summary["eval_after"]["accuracy"] > 0.8
    # the last budget's groups were all solved: in the append-only audit, each with reward 1.0
    last = read_audit(set_aside_audit_path(run_dir))[-int(said.group(1)):]  # the loop stopped right after them
    assert {a["reason"] for a in last} == {"solved"} and {a["reward"] for a in last} == {1.0}
    assert set(summary["set_aside_prompts"]["solved"]) >= {a["prompt"] for a in last}
    assert rewarded("7") and not rewarded("x")  # the task as the test reads it
