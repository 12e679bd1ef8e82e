"""Learner failover for real: `agentrl train` with checkpoints, the learner rank's process killed
with SIGKILL mid-run (from outside, as the OOM killer would); the run restarts the learner from the
newest checkpoint in the same process and completes every step, each prompt trained once (by the
learner's and the rollout workers' append-only audit logs, not the controller's own account)."""

import json
import os
import signal
import subprocess
import time

import pytest

from agentrl.engine.common.audit import learner_audit_path, read_audit
from tests.e2e.helpers import REPO, check_audit, kill_tree, train_cmd

MAX_STEPS, BATCH, GROUP, STALENESS = 6, 8, 4, 1  # the overrides below; tiny_calc's group size and staleness bound


def _cmd(run_dir, model, *extra):
    return train_cmd(
        run_dir, model,
        "sft.steps=0",
        "eval.limit=0",
        "learner.max_degenerate_steps=0",  # the untrained model earns no reward on Calc: every step is degenerate, on purpose here
        f"learner.max_steps={MAX_STEPS}",
        f"learner.batch_size={BATCH}",
        "rollout.max_new_tokens=16",
        "checkpoint.every_steps=2",
        *extra,
    )


def _learner_pids(run_dir) -> list[int]:
    path = learner_audit_path(run_dir)
    return [rec["pid"] for rec in read_audit(path)] if path.exists() else []


def _audit_steps(run_dir) -> list[int]:
    path = learner_audit_path(run_dir)
    return [rec["step"] for rec in read_audit(path)] if path.exists() else []


@pytest.mark.e2e
@pytest.mark.vllm
def test_sigkill_of_the_learner_is_survived_in_run(tmp_path, tiny_calc_model):
    run_dir = tmp_path / "run"
    log = (tmp_path / "run.log").open("w")
    proc = subprocess.Popen(
        _cmd(run_dir, tiny_calc_model), cwd=REPO, stdout=log, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "RAY_DEDUP_LOGS": "0"}, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and (not _audit_steps(run_dir) or max(_audit_steps(run_dir)) < 3):
            assert proc.poll() is None, (tmp_path / "run.log").read_text()[-4000:]
            time.sleep(0.2)
        assert _audit_steps(run_dir) and max(_audit_steps(run_dir)) >= 3, "the learner never reached step 3"
        killed_at = max(_audit_steps(run_dir))
        learner_pid = _learner_pids(run_dir)[-1]
        os.kill(learner_pid, signal.SIGKILL)  # the learner rank's process, as the OOM killer would
        rc = proc.wait(timeout=900)
    finally:
        if proc.poll() is None:
            kill_tree(proc)
        log.close()
    output = (tmp_path / "run.log").read_text()
    assert rc == 0, output[-5000:]
    assert "Traceback" not in output, output[-5000:]

    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["version"] for r in records if r["kind"] == "step"] == [1, 2, 3, 4, 5, 6]
    restarts = [r for r in records if r["kind"] == "event" and r.get("learner_restarts")]
    assert len(restarts) == 1, [r["message"] for r in records if r["kind"] == "event"]
    assert "learner rank 0 died" in restarts[0]["message"] and "restarting the learner from checkpoint step_" in restarts[0]["message"]
    assert "restarting the learner" in output  # said on the console too

    trained = [json.loads(line) for line in (run_dir / "trained.jsonl").read_text().splitlines()]
    assert [t["step"] for t in trained] == [1, 2, 3, 4, 5, 6]
    # each prompt trained once, none lost: by what the learner ranks and rollout workers recorded
    summary = json.loads((run_dir / "summary.json").read_text())
    check_audit(run_dir, summary, killed_at=killed_at, max_steps=MAX_STEPS, batch=BATCH, group=GROUP, staleness=STALENESS)
    # two learner processes trained: the killed one, then the restarted one, which went on from
    # the checkpoint (its first step is the checkpoint's + 1)
    pids = list(dict.fromkeys(_learner_pids(run_dir)))
    assert len(pids) == 2 and pids[0] == learner_pid, pids
    second = [rec["step"] for rec in read_audit(learner_audit_path(run_dir)) if rec["pid"] == pids[1]]
    assert second[0] in (3, 5) and second[-1] == 6, second
    assert (run_dir / "final" / "config.json").is_file()
