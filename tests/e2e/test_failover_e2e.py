"""Failover for real, one run that loses four components (issues 33, 37): `agentrl train` on the
tiny main job with checkpoints, a reward model (the tiny model with a seeded classifier head,
weight 0: it scores every episode, the reward stays the environment's) and a separate frozen
judge (the tiny model again, on a vLLM engine of its own, weight 0, "Score: N" by structured
output), the rollout worker's process killed with SIGKILL at step 2, the reward model's actor at
step 3, the judge generator's actor at step 4, then the learner rank's process at step 5 (from
outside, as the OOM killer would).

The run replaces the worker with one of the same settings (re-issuing the groups it had in flight),
replaces the reward model and the judge generator (the episodes each was scoring are
infrastructure failures, never a 0), and restarts the learner from the newest checkpoint, in the
same process, and completes every
step. Each replacement is one event in metrics.jsonl and one plain console line (no Ray
traceback). Checked from the learner's and the rollout workers' append-only audit logs, not the
controller's own account: no sample trained twice, every trained sample from an episode a rollout
worker recorded as finished, each prompt trained once and none lost or abandoned."""

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from agentrl.engine.common.audit import episodes_audit_path, learner_audit_path, read_audit
from tests.e2e.chaos import actor_process
from tests.e2e.helpers import REPO, actor_pids, check_audit, kill_tree, records, steps, train_cmd

MAX_STEPS, BATCH, GROUP, STALENESS = 8, 8, 4, 1  # the overrides below; tiny_calc's group size and staleness bound
WORKER_AT, REWARD_MODEL_AT, JUDGE_AT, LEARNER_AT = 2, 3, 4, 5  # the steps after which each is killed


def _pids(path: Path) -> list[int]:
    """The processes that wrote records to an audit log, in order of their first record."""
    return list(dict.fromkeys(rec["pid"] for rec in read_audit(path))) if path.exists() else []


def _audit_steps(run_dir: Path) -> list[int]:
    path = learner_audit_path(run_dir)
    return [rec["step"] for rec in read_audit(path)] if path.exists() else []


def _replaced(run_dir: Path, metric: str) -> bool:
    """Whether the run logged the replacement event ``metric`` (``reward_model_restarts``...)."""
    return any(r.get("kind") == "event" and r.get(metric) for r in records(run_dir))


def _parts(error: str) -> list[str]:
    """Each scorer's failure in an episode's error (several failed scorers are joined by "; ")."""
    return [part.strip() for part in error.split("; ")]


def _wait(proc: subprocess.Popen, log_path: Path, reached: Callable[[], bool], what: str, timeout_s: float = 600) -> None:
    """Wait until ``reached()``; fail the test (with the run's console) if the run ends first or
    ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while not reached():
        assert proc.poll() is None, log_path.read_text()[-4000:]
        assert time.monotonic() < deadline, f"the run never reached {what}"
        time.sleep(0.2)


@pytest.mark.e2e
@pytest.mark.vllm
def test_sigkill_of_the_rollout_worker_the_reward_model_then_the_learner_is_survived_in_run(tmp_path, tiny_calc_model):
    run_dir, log_path = tmp_path / "run", tmp_path / "run.log"
    cmd = train_cmd(
        run_dir, tiny_calc_model,
        "sft.steps=0",
        "eval.limit=0",
        "learner.max_degenerate_steps=0",  # the untrained model earns no reward on Calc: degenerate steps, on purpose
        f"learner.max_steps={MAX_STEPS}",
        f"learner.batch_size={BATCH}",
        "rollout.max_new_tokens=16",
        "checkpoint.every_steps=2",
        f"reward.model.path={tiny_calc_model}",
        "reward.model.weight=0.0",
        f"reward.judge.model={tiny_calc_model}",  # a separate, frozen judge: an engine of its own
        "reward.judge.weight=0.0",
        'reward.judge.output_regex="Score: [0-9]"',  # the untrained model always gives a score
        "reward.judge.max_tokens=8",
    )
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "RAY_DEDUP_LOGS": "0"}, start_new_session=True)
    try:
        _wait(proc, log_path, lambda: max(steps(run_dir), default=0) >= WORKER_AT, f"step {WORKER_AT}")
        worker_pid = _pids(episodes_audit_path(run_dir))[-1]
        os.kill(worker_pid, signal.SIGKILL)  # the rollout worker's process
        # each death is handled before the next kill (on a fast machine the next step can come
        # before the groups that meet the dead actor have finished)
        _wait(proc, log_path, lambda: max(steps(run_dir), default=0) >= REWARD_MODEL_AT and _replaced(run_dir, "rollout_worker_restarts"),
              f"step {REWARD_MODEL_AT} and the rollout worker's replacement")
        rm_pids = actor_pids(run_dir, "reward-model")
        assert len(rm_pids) == 1, rm_pids
        os.kill(rm_pids[0], signal.SIGKILL)  # the reward model's actor
        _wait(proc, log_path, lambda: max(steps(run_dir), default=0) >= JUDGE_AT and _replaced(run_dir, "reward_model_restarts"),
              f"step {JUDGE_AT} and the reward model's replacement")
        judge_pid = actor_process(run_dir, "judge-0", set())
        assert judge_pid is not None, actor_pids(run_dir, "judge-0")
        os.kill(judge_pid, signal.SIGKILL)  # the judge generator's actor (its vLLM engine core dies with it)
        _wait(proc, log_path, lambda: max(_audit_steps(run_dir), default=0) >= LEARNER_AT and _replaced(run_dir, "judge_generator_restarts"),
              f"learner step {LEARNER_AT} and the judge generator's replacement")
        killed_at = max(_audit_steps(run_dir))
        learner_pid = _pids(learner_audit_path(run_dir))[-1]
        os.kill(learner_pid, signal.SIGKILL)  # the learner rank's process
        rc = proc.wait(timeout=900)
    finally:
        if proc.poll() is None:
            kill_tree(proc)
    output = log_path.read_text()
    assert rc == 0, output[-5000:]
    assert "Traceback" not in output, output[-5000:]
    # Ray's own paragraph for each killed process goes to the run's logs, not beside agentrl's line
    assert "(raylet)" not in output, output[-5000:]
    assert "died" in (run_dir / "logs" / "ray_errors.log").read_text()

    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    events = [r["message"] for r in records if r["kind"] == "event"]
    assert [r["version"] for r in records if r["kind"] == "step"] == list(range(1, MAX_STEPS + 1))
    worker_restarts = [r for r in records if r["kind"] == "event" and r.get("rollout_worker_restarts")]
    assert len(worker_restarts) == 1 and worker_restarts[0]["message"].startswith("rollout worker 0 died"), events
    assert sum("rollout worker 0 died" in line for line in output.splitlines()) == 1, output[-5000:]  # one console line
    rm_restarts = [r for r in records if r["kind"] == "event" and r.get("reward_model_restarts")]
    assert len(rm_restarts) == 1 and rm_restarts[0]["message"].startswith("reward model died"), events
    assert sum("reward model died (" in line for line in output.splitlines()) == 1, output[-5000:]  # one console line
    # a group all of whose episodes it was scoring is re-issued ("(its reward model died); re-issued",
    # one short line each); whether any group was wholly in its hands when it died is timing: the
    # episodes it was scoring are infrastructure failures either way (below)
    # the episodes it was scoring: infrastructure failures in words (samples.jsonl keeps each failed group's first)
    failures = [json.loads(line).get("error", "") for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert any(p.startswith("reward model: the call failed") for e in failures for p in _parts(e)), failures
    judge_restarts = [r for r in records if r["kind"] == "event" and r.get("judge_generator_restarts")]
    assert len(judge_restarts) == 1 and judge_restarts[0]["message"].startswith("judge generator 0 died"), events
    assert sum("judge generator 0 died (" in line for line in output.splitlines()) == 1, output[-5000:]
    assert any(p.startswith("judge: the generator failed") for e in failures for p in _parts(e)), failures  # its episodes: infrastructure failures in words
    learner_restarts = [r for r in records if r["kind"] == "event" and r.get("learner_restarts")]
    assert len(learner_restarts) == 1, events
    assert "learner rank 0 died" in learner_restarts[0]["message"]
    assert "restarting the learner from checkpoint step_" in learner_restarts[0]["message"]
    assert "restarting the learner" in output  # said on the console too

    # two rollout worker processes played episodes: the killed one, then its replacement
    episode_pids = _pids(episodes_audit_path(run_dir))
    assert len(episode_pids) == 2 and episode_pids[0] == worker_pid, episode_pids
    # two learner processes trained: the killed one, then the restarted one, which went on from
    # the checkpoint (its first step is the checkpoint's + 1)
    learner_pids = _pids(learner_audit_path(run_dir))
    assert len(learner_pids) == 2 and learner_pids[0] == learner_pid, learner_pids
    second = [rec["step"] for rec in read_audit(learner_audit_path(run_dir)) if rec["pid"] == learner_pids[1]]
    assert second[0] in (5, 7) and second[-1] == MAX_STEPS, second
    trained = [json.loads(line) for line in (run_dir / "trained.jsonl").read_text().splitlines()]
    assert [t["step"] for t in trained] == list(range(1, MAX_STEPS + 1))
    # each prompt trained once, none lost, every trained sample from a finished episode
    summary = json.loads((run_dir / "summary.json").read_text())
    check_audit(run_dir, summary, killed_at=killed_at, max_steps=MAX_STEPS, batch=BATCH, group=GROUP, staleness=STALENESS)
    assert (run_dir / "final" / "config.json").is_file()
