"""Kill a run with SIGKILL mid-way, resume it, and check that no prompt is lost or trained twice."""

import json
import os
import signal
import subprocess
import time

import psutil
import pytest

from tests.e2e.helpers import REPO, train_cmd


def _cmd(run_dir, model):
    return train_cmd(
        run_dir, model,
        "sft.steps=0",
        "eval.limit=0",
        "learner.max_steps=5",
        "learner.batch_size=8",
        "rollout.max_new_tokens=16",
        "checkpoint.every_steps=1",
        "checkpoint.keep=2",
    )


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the run and every process it started (Ray, vLLM), as a crash would."""
    try:
        family = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        family = []
    os.killpg(proc.pid, signal.SIGKILL)
    for p in family:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    proc.wait(timeout=60)


def _steps(run_dir):
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if rec.get("kind") == "step":
            out.append(rec["step"])
    return out


@pytest.mark.e2e
@pytest.mark.vllm
def test_sigkill_and_resume_loses_no_prompt(tmp_path, tiny_calc_model):
    run_dir = tmp_path / "run"
    env = {**os.environ, "RAY_DEDUP_LOGS": "0"}
    log1 = open(tmp_path / "first.log", "w")
    proc = subprocess.Popen(_cmd(run_dir, tiny_calc_model), cwd=REPO, stdout=log1, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.monotonic() + 600
    try:
        while time.monotonic() < deadline:
            if len(list((run_dir / "checkpoints").glob("step_*/state.pkl"))) >= 1 and max(_steps(run_dir), default=0) >= 2:
                break
            assert proc.poll() is None, (tmp_path / "first.log").read_text()[-5000:]
            time.sleep(0.5)
        else:
            pytest.fail("the first run did not reach step 2 in time")
    finally:
        _kill_tree(proc)
    killed_at = max(_steps(run_dir))
    assert killed_at < 5

    second = subprocess.run(_cmd(run_dir, tiny_calc_model), cwd=REPO, capture_output=True, text=True, timeout=900, env=env)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-5000:]
    assert "resuming from" in second.stderr

    steps = _steps(run_dir)
    assert steps == [1, 2, 3, 4, 5], steps  # step and version continue, lost steps are redone once
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
