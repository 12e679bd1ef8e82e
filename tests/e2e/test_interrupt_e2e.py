"""Ctrl-C stops a run cleanly: the command exits with 130 and says so, and no process it started
is left behind.

Every process of the run is recognised by a token in its environment (Ray's workers and vLLM's
engines inherit the driver's environment), so the check after exit scans the whole machine
rather than the descendants that happened to be sampled while the run was alive."""

import json
import os
import signal
import subprocess
import time
import uuid

import psutil
import pytest

from tests.e2e.helpers import REPO, train_cmd


def _with_token(token: str) -> list[str]:
    """Live, non-zombie processes anywhere on the machine whose environment holds ``token``."""
    found = []
    for p in psutil.process_iter(["pid", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE or p.pid == os.getpid():
                continue
            if p.environ().get("AGENTRL_TEST_RUN_TOKEN") == token:
                found.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


@pytest.mark.e2e
@pytest.mark.vllm
def test_ctrl_c_leaves_no_orphan(tmp_path, tiny_calc_model):
    run_dir = tmp_path / "run"
    cmd = train_cmd(
        run_dir, tiny_calc_model,
        "sft.steps=0",
        "eval.limit=0",
        "learner.max_degenerate_steps=0",  # the untrained model earns no reward on Calc: every step is degenerate, on purpose here
        "learner.max_steps=100",
        "learner.batch_size=8",
        "rollout.max_new_tokens=16",
    )
    token = f"agentrl-interrupt-{uuid.uuid4().hex}"
    env = {**os.environ, "AGENTRL_TEST_RUN_TOKEN": token}
    log = open(tmp_path / "run.log", "w")
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    seen: dict[int, psutil.Process] = {}
    deadline = time.monotonic() + 600
    try:
        while time.monotonic() < deadline:
            for p in psutil.Process(proc.pid).children(recursive=True):
                seen.setdefault(p.pid, p)
            metrics = run_dir / "metrics.jsonl"
            if metrics.exists() and any(json.loads(line)["kind"] == "step" for line in metrics.read_text().splitlines() if line.strip()):
                break
            assert proc.poll() is None, (tmp_path / "run.log").read_text()[-4000:]
            time.sleep(0.5)
        else:
            pytest.fail("no learner step within the deadline")
        for p in psutil.Process(proc.pid).children(recursive=True):
            seen.setdefault(p.pid, p)
        assert len(seen) >= 3  # ray, the generator's vLLM engine, the learner...
        assert _with_token(token)  # the token does reach the run's processes
        os.kill(proc.pid, signal.SIGINT)  # what Ctrl-C sends to the foreground process
        rc = proc.wait(timeout=120)
        log.flush()
        assert rc == 130, (rc, (tmp_path / "run.log").read_text()[-4000:])  # 1 would be a crash
        assert "agentrl: interrupted" in (tmp_path / "run.log").read_text()
        deadline = time.monotonic() + 15
        while (alive := _with_token(token)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not alive, "left behind after Ctrl-C:\n" + "\n".join(alive)
        gone = []
        for p in seen.values():
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    gone.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
            except psutil.NoSuchProcess:
                pass
        assert not gone, "left behind after Ctrl-C:\n" + "\n".join(gone)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for p in seen.values():
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
