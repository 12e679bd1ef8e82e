"""A rollout worker tells its sandbox's counters (what the run's SandboxWatch logs): on a real warm
bubblewrap sandbox, a worker SIGKILLed from outside between executions is found dead and
replaced, and ``sandbox_stats`` says so, with the rollout worker's process id."""

from __future__ import annotations

import os
import signal

import anyio
import psutil

from agentrl.engine.episodes.rollout import RolloutWorker
from agentrl.engine.episodes.runner import EpisodeSettings


def _kill_warm_workers() -> int:
    """SIGKILL every bubblewrap process group this process started (the warm workers)."""
    killed = 0
    for child in psutil.Process().children():
        if child.name() == "bwrap" and os.getpgid(child.pid) == child.pid:
            os.killpg(child.pid, signal.SIGKILL)
            killed += 1
    return killed


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
            with anyio.fail_after(60):
                after = await sandbox.run("print(6*7)")
            return before, killed, worker.sandbox_stats(), after.stdout
        finally:
            await worker.runner.shutdown()

    before, killed, after, stdout = anyio.run(go)
    assert killed >= 1
    assert before["pid"] == after["pid"] == os.getpid()
    assert before["workers_replaced"] == 0
    assert after["workers_replaced"] >= 1, after  # found dead and replaced
    assert stdout == "42\n"  # the next, innocent execution never saw it
