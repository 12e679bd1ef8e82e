"""A user's first day, through the CLI (issue 36): their own environment module and their own
reward functions (``[[reward.functions]]``, one async, one plain) beside their recipe, run from
another directory without PYTHONPATH; the run checkpoints without being asked
(after step 1); a rerun of the finished run says plainly that it starts a new one and keeps the
old one aside; ``--resume-from`` goes on from a checkpoint of that old run. The console, off a
terminal and without COLUMNS: the first lines name the TensorBoard and report commands, step lines
carry an ETA from the second step, no line is wrapped, and every line is one of agentrl's own."""

import json
import os
import re
import subprocess
import sys

import pytest

from tests.e2e.helpers import REPO, foreign_lines, steps
from tests.test_user_code import USER_ENV

MAX_STEPS = 3

USER_REWARDS = '''
async def tagged(completion, messages, row):
    """0.25 when the function was given the real episode: the conversation starts with the row's
    question and ends with the model's turn."""
    ok = messages[0]["content"] == row["question"] and messages[-1]["role"] == "assistant" and isinstance(completion, str)
    return 0.25 if ok else -100.0


def has_answer(row, env_reward):
    return 0.125 if "answer" in row and env_reward >= 0.5 else -100.0
'''


def _events(run_dir):
    """The event messages of ``run_dir/metrics.jsonl`` (the console wraps lines to its width)."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["message"] for r in records if r["kind"] == "event"]


def _train(recipe, cwd, *extra):
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "COLUMNS")}
    cmd = [sys.executable, "-m", "agentrl.cli", "train", str(recipe), *extra]
    return subprocess.run(cmd, cwd=cwd, env={**environ, "RAY_DEDUP_LOGS": "0"}, capture_output=True, text=True, timeout=900)


@pytest.mark.e2e
@pytest.mark.vllm
def test_own_module_default_checkpoints_rerun_and_resume_from(tmp_path, tiny_calc_model):
    proj, elsewhere = tmp_path / "proj", tmp_path / "elsewhere"
    proj.mkdir()
    elsewhere.mkdir()
    (proj / "my_envs.py").write_text(USER_ENV)
    (proj / "my_rewards.py").write_text(USER_REWARDS)
    run_dir = proj / "run"
    base = (REPO / "recipes" / "tiny_calc.toml").read_text()
    recipe = proj / "recipe.toml"
    recipe.write_text(base.replace('path = "runs/models/tiny-calc"', f'path = "{tiny_calc_model}"')
                      .replace('id = "agentrl/Calc-v0"\nkwargs = { max_turns = 3 }', 'id = "my_envs:EchoEnv"\nkwargs = { bonus = 0.5 }')
                      .replace('name = "tiny_calc"', f'name = "first_day"\nrun_dir = "{run_dir}"')
                      + '\n[[reward.functions]]\nfn = "my_rewards:tagged"\n\n[[reward.functions]]\nfn = "my_rewards:has_answer"\nweight = 2\n')
    assert "my_envs:EchoEnv" in recipe.read_text() and str(run_dir) in recipe.read_text()
    sets = ["--set", "sft.steps=0", "--set", "eval.limit=0", "--set", "learner.max_degenerate_steps=0",
            "--set", f"learner.max_steps={MAX_STEPS}", "--set", "learner.batch_size=8", "--set", "rollout.max_new_tokens=16"]

    first = _train(recipe, elsewhere, *sets)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-5000:]
    assert "kept as" not in first.stderr and not list(proj.glob("run.old-*"))  # a new run directory: nothing set aside
    assert steps(run_dir) == [1, 2, 3]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # the user's environment ran in the rollout workers (its bonus 0.5 is in every reward), and so did
    # the user's reward functions, given the real episode: 0.25 + 2 * 0.125 more, no episode lost to them
    step_records = [r for r in records if r["kind"] == "step"]
    assert all(r["reward_mean"] >= 1.0 and r["reward_failures_batch"] == 0 for r in step_records), step_records
    assert all(r["fn/tagged_mean"] == 0.25 and r["fn/has_answer_mean"] == 0.125 for r in step_records), step_records
    # checkpointed without a [checkpoint] section: after step 1 (checkpoint.first_step)
    assert (run_dir / "checkpoints" / "step_000001" / "state.pkl").is_file()
    # the console (not a terminal, no COLUMNS): the commands that show the run, whole on one line each
    lines = first.stderr.splitlines()
    assert f"curves: tensorboard --logdir {run_dir / 'tensorboard'}; report (plots, trajectories): agentrl report {run_dir}" in lines, lines[:10]
    # one readable line per component when it is ready, and the dtype the run chose
    assert any(re.fullmatch(r"generators ready: 1 vLLM engine on cpu, started in \d+\.\d s", line) for line in lines), lines[:20]
    assert any(re.fullmatch(r"learner ready: 1 rank on cpu \(gloo\), [\d.]+( [kMB])? parameters, full fine-tuning(, .+)?, started in "
                            r"\d+\.\d s", line) for line in lines), lines[:20]
    assert "dtype: float32 (set in the recipe)" in lines, lines[:20]
    step_lines = [line for line in lines if re.match(r"step +\d+ v", line)]
    assert len(step_lines) == MAX_STEPS and "eta" not in step_lines[0], step_lines  # no ETA before a step time is known
    assert re.search(r"  t=\d+s  eta \d+(s|m\d\ds)$", step_lines[1]), step_lines  # step 2 of 3: one step left
    first_console = first.stderr

    second = _train(recipe, elsewhere, *sets)
    assert second.returncode == 0, second.stderr[-5000:]
    [old] = sorted(proj.glob("run.old-*"))
    said = f"{run_dir} held a finished run: starting a new run at step 0; the finished one is kept as {old}"
    assert any(m.startswith(said) for m in _events(run_dir)), _events(run_dir)
    assert "held a finished run" in " ".join(second.stderr.split())  # said on the console too (wrapped to its width)
    assert (old / "summary.json").is_file() and steps(run_dir) == [1, 2, 3]

    third = _train(recipe, elsewhere, *sets, "--resume-from", str(old / "checkpoints" / "step_000001"))
    assert third.returncode == 0, third.stderr[-5000:]
    messages = _events(run_dir)
    assert any(m.startswith(f"--resume-from: going on from {old / 'checkpoints' / 'step_000001'} (step 1)") for m in messages), messages
    assert any(m.startswith("resuming from") for m in messages), messages
    assert steps(run_dir) == [2, 3]  # steps 2 and 3 trained again from the old run's step 1
    assert len(sorted(proj.glob("run.old-*"))) == 2  # the second run was set aside, not overwritten
    # every console line of the first run is agentrl's own (an allowlisted format or a logged event)
    foreign = foreign_lines(first_console, old)
    assert foreign == [], "\n".join(foreign[:20])
