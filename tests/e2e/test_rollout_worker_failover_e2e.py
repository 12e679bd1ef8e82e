"""Rollout worker failover for real (issue 37): `agentrl train` on the tiny main job, the rollout
worker's process killed with SIGKILL mid-run (from outside, as the OOM killer would). The run
replaces the worker with one of the same settings, re-issues the groups it had in flight, and
completes every step; the replacement is one event in metrics.jsonl and one plain console line
(no Ray traceback). Checked from the append-only audit logs: no sample trained twice, every
trained sample from an episode a rollout worker recorded as finished, no prompt abandoned."""

import json
import os
import signal
import subprocess
import time

import pytest

from agentrl.engine.common.audit import episodes_audit_path, learner_audit_path, read_audit
from tests.e2e.helpers import REPO, kill_tree, sample_prompt, steps, train_cmd

MAX_STEPS, BATCH = 6, 8


def _episode_pids(run_dir) -> list[int]:
    path = episodes_audit_path(run_dir)
    return list(dict.fromkeys(rec["pid"] for rec in read_audit(path))) if path.exists() else []


@pytest.mark.e2e
@pytest.mark.vllm
def test_sigkill_of_the_rollout_worker_is_survived_in_run(tmp_path, tiny_calc_model):
    run_dir = tmp_path / "run"
    cmd = train_cmd(
        run_dir, tiny_calc_model,
        "sft.steps=0",
        "eval.limit=0",
        "learner.max_degenerate_steps=0",  # the untrained model earns no reward on Calc: degenerate steps, on purpose
        f"learner.max_steps={MAX_STEPS}",
        f"learner.batch_size={BATCH}",
        "rollout.max_new_tokens=16",
    )
    log = (tmp_path / "run.log").open("w")
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "RAY_DEDUP_LOGS": "0"}, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and max(steps(run_dir), default=0) < 2:
            assert proc.poll() is None, (tmp_path / "run.log").read_text()[-4000:]
            time.sleep(0.2)
        assert max(steps(run_dir), default=0) >= 2, "the run never reached step 2"
        worker_pid = _episode_pids(run_dir)[-1]
        os.kill(worker_pid, signal.SIGKILL)  # the rollout worker's process, as the OOM killer would
        rc = proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            kill_tree(proc)
        log.close()
    output = (tmp_path / "run.log").read_text()
    assert rc == 0, output[-5000:]
    assert "Traceback" not in output, output[-5000:]

    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["version"] for r in records if r["kind"] == "step"] == list(range(1, MAX_STEPS + 1))
    restarts = [r for r in records if r["kind"] == "event" and r.get("rollout_worker_restarts")]
    assert len(restarts) == 1, [r["message"] for r in records if r["kind"] == "event"]
    assert restarts[0]["message"].startswith("rollout worker 0 died"), restarts
    assert sum("rollout worker 0 died" in line for line in output.splitlines()) == 1, output[-5000:]  # one console line

    # two rollout worker processes played episodes: the killed one, then its replacement
    pids = _episode_pids(run_dir)
    assert len(pids) == 2 and pids[0] == worker_pid, pids
    # from the audit logs: no sample trained twice, each from an episode recorded as finished
    audit = read_audit(learner_audit_path(run_dir))
    assert [rec["step"] for rec in audit] == list(range(1, MAX_STEPS + 1))
    ids = [s["id"] for rec in audit for s in rec["samples"]]
    assert len(ids) == len(set(ids)) == MAX_STEPS * BATCH, "a sample was trained twice"
    episodes = read_audit(episodes_audit_path(run_dir))
    finished = {e["id"] for e in episodes if e["status"] != "infra_failure"}
    assert set(ids) <= finished, "the learner trained a sample no rollout worker finished"
    per_step = [{sample_prompt(s["id"]) for s in rec["samples"]} for rec in audit]
    assert sum(map(len, per_step)) == len(set().union(*per_step)), f"a prompt was trained in two steps: {per_step}"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["abandoned_prompts"] == [] and summary["dropped_prompts"] == []
    assert (run_dir / "final" / "config.json").is_file()
