"""A rollout worker tells its sandbox's counters (what the run's SandboxWatch logs): on a real warm
bubblewrap sandbox, a worker SIGKILLed from outside while idle is counted as replaced by the next
``sandbox_stats`` (before any execution finds it dead), once, with the rollout worker's process
id, and the next execution runs on a fresh worker."""

from __future__ import annotations

import os
import signal
import time

import anyio
import psutil

from agentrl.engine.episodes.rollout import RolloutWorker
from agentrl.engine.episodes.runner import EpisodeSettings


def _kill_warm_workers() -> int:
    """SIGKILL every bubblewrap process group this process started (the warm workers), and wait
    (at most 10 s) until each is dead, a zombie its parent has not reaped yet."""
    killed = []
    for child in psutil.Process().children():
        if child.name() == "bwrap" and os.getpgid(child.pid) == child.pid:
            os.killpg(child.pid, signal.SIGKILL)
            killed.append(child)
    deadline = time.monotonic() + 10
    while not all(_dead(p) for p in killed) and time.monotonic() < deadline:
        time.sleep(0.02)
    return len(killed)


def _dead(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_warm_sandbox_worker_killed_from_outside_is_counted_as_replaced(tiny_calc_model):
    worker = RolloutWorker(
        episodes=EpisodeSettings(
            tokenizer=str(tiny_calc_model), env_id="agentrl/Calc-v0", env_kwargs={}, sandbox_kind="bubblewrap",
            sandbox_kwargs={"max_concurrency": 1, "timeout_s": 20.0, "memory_mb": 512}, sampling={},
            max_new_tokens=16, max_episode_tokens=512, seed=0,
        ),
        generators=[], max_concurrent_episodes=1, generate_timeout_s=10,
    )
    sandbox = worker.runner.sandbox

    async def go() -> tuple[dict[str, int], int, dict[str, int], str]:
        try:
            await sandbox.start()
            assert (await sandbox.run("print(1)")).ok
            before = worker.sandbox_stats()
            killed = _kill_warm_workers()
            said = worker.sandbox_stats()  # before any execution finds it dead
            with anyio.fail_after(60):
                after = await sandbox.run("print(6*7)")
            assert worker.sandbox_stats()["workers_replaced"] == said["workers_replaced"]  # counted once
            return before, killed, said, after.stdout
        finally:
            await worker.runner.shutdown()

    before, killed, after, stdout = anyio.run(go)
    assert killed >= 1
    assert before["pid"] == after["pid"] == os.getpid()
    assert before["workers_replaced"] == 0
    assert after["workers_replaced"] == killed, after  # found dead while idle, and counted
    assert stdout == "42\n"  # the next, innocent execution never saw it
