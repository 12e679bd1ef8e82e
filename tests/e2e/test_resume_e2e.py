"""Kill a run with SIGKILL mid-way, resume it, and check that no prompt is lost or trained twice.

The evidence is the learner's own append-only audit (what rank 0 trained on, step by step, in
both processes) and the rollout workers' record of every finished episode, not the controller's
summary (which a resume rewrites)."""

import json
import os
import subprocess

import pytest

from tests.e2e.helpers import REPO, check_audit, run_then_kill, steps, train_cmd

BATCH, GROUP, STALENESS = 8, 4, 1  # learner.batch_size below; tiny_calc's group size and staleness bound


def _cmd(run_dir, model):
    return train_cmd(
        run_dir, model,
        "sft.steps=0",
        "eval.limit=0",
        "learner.max_degenerate_steps=0",  # the untrained model earns no reward on Calc: every step is degenerate, on purpose here
        "learner.max_steps=5",
        "learner.batch_size=8",
        "rollout.max_new_tokens=16",
        "checkpoint.every_steps=1",
        "checkpoint.keep=2",
    )


@pytest.mark.e2e
@pytest.mark.vllm
def test_sigkill_and_resume_loses_no_prompt(tmp_path, tiny_calc_model):
    run_dir = tmp_path / "run"
    env = {**os.environ, "RAY_DEDUP_LOGS": "0"}
    killed_at = run_then_kill(_cmd(run_dir, tiny_calc_model), run_dir, tmp_path / "first.log")
    assert killed_at < 5

    second = subprocess.run(_cmd(run_dir, tiny_calc_model), cwd=REPO, capture_output=True, text=True, timeout=900, env=env)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-5000:]
    assert "resuming from" in second.stderr

    done = steps(run_dir)
    assert done == [1, 2, 3, 4, 5], done  # step and version continue, lost steps are redone once
    trained = [json.loads(line) for line in (run_dir / "trained.jsonl").read_text().splitlines()]
    assert [t["step"] for t in trained] == [1, 2, 3, 4, 5]
    prompts = [p for t in trained for p in t["prompts"]]
    assert len(prompts) == len(set(prompts)), f"a prompt was trained twice: {prompts}"
    # no prompt lost: every issued prompt index is trained exactly once, or still untrained
    # (queued or in flight) at the end, or counted as dropped for staleness
    summary = json.loads((run_dir / "summary.json").read_text())
    accounted = prompts + summary["untrained_prompts"] + summary["dropped_prompts"] + summary["abandoned_prompts"]
    assert sorted(accounted) == list(range(summary["prompt_cursor"])), (prompts, summary)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(r["dropped_stale"] == 0 for r in records if r["kind"] == "step")
    assert (run_dir / "final" / "model.safetensors").exists()
    check_audit(run_dir, summary, killed_at=killed_at, max_steps=5, batch=BATCH, group=GROUP, staleness=STALENESS)
