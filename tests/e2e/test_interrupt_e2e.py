"""Ctrl-C stops a run cleanly: the command exits, and no process it started is left behind."""

import json
import os
import signal
import subprocess
import time

import psutil
import pytest

from tests.e2e.helpers import REPO, train_cmd


@pytest.mark.e2e
@pytest.mark.vllm
def test_ctrl_c_leaves_no_orphan(tmp_path, tiny_calc_model):
    run_dir = tmp_path / "run"
    cmd = train_cmd(
        run_dir, tiny_calc_model,
        "sft.steps=0",
        "eval.limit=0",
        "learner.max_steps=100",
        "learner.batch_size=8",
        "rollout.max_new_tokens=16",
    )
    log = open(tmp_path / "run.log", "w")
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
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
        os.kill(proc.pid, signal.SIGINT)  # what Ctrl-C sends to the foreground process
        rc = proc.wait(timeout=120)
        assert rc in (130, 1, -signal.SIGINT), rc
        time.sleep(5)
        alive = []
        for p in seen.values():
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
            except psutil.NoSuchProcess:
                pass
        assert not alive, "left behind after Ctrl-C:\n" + "\n".join(alive)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for p in seen.values():
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
