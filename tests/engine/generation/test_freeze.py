"""Colocated on CPUs, a generator's engine processes are stopped while the learner trains and
continue before the engine is used again (:mod:`agentrl.engine.generation.freeze`): real
processes and real signals here, with a recording stand-in for vLLM's ``AsyncLLM``."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentrl.engine.generation import generator as generator_module
from agentrl.engine.generation.freeze import engine_processes, freeze, thaw
from agentrl.engine.generation.generator import EngineSettings, VllmGenerator


def state(pid: int) -> str:
    """The process state letter of ``pid`` (``T``: stopped)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


@pytest.fixture
def spinner():
    """A child process that polls like vLLM-CPU's engine core does: it never idles."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    yield proc
    proc.kill()
    proc.wait(10)


def test_a_stopped_process_uses_no_cpu_until_it_continues(spinner):
    time.sleep(0.3)
    assert spinner.pid in engine_processes()  # a descendant of this process
    assert freeze([spinner.pid, 999_999_999]) == [spinner.pid]  # a gone pid is skipped
    time.sleep(0.1)
    assert state(spinner.pid) == "T"
    before = cpu_ticks(spinner.pid)
    time.sleep(0.5)
    assert cpu_ticks(spinner.pid) == before  # stopped: not one tick of CPU
    thaw([spinner.pid])
    time.sleep(0.5)
    assert state(spinner.pid) != "T" and cpu_ticks(spinner.pid) > before


class Engine:
    """The ``AsyncLLM`` calls a CPU sleep, a request and a disk load make, recorded."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def pause_generation(self, mode: str = "abort", clear_cache: bool = True) -> None:
        self.calls.append("pause")

    async def collective_rpc(self, method, kwargs=None):
        self.calls.append(method)

    async def update_weight_version(self, version: str) -> None:
        self.calls.append("version")

    async def resume_generation(self) -> None:
        self.calls.append("resume")

    def shutdown(self) -> None:
        self.calls.append("shutdown")


def cpu_generator(monkeypatch, pids: list[int]) -> VllmGenerator:
    monkeypatch.setattr(generator_module, "engine_processes", lambda exclude=frozenset(): list(pids))
    monkeypatch.setattr(generator_module, "start_sentinel", lambda: 0)
    g = VllmGenerator(EngineSettings(model="unused", sleep_mode=True))
    g.engine = Engine()
    g._on_gpu = False  # what start() found
    return g


def test_a_sleeping_cpu_generator_stops_its_engine_and_a_load_continues_it_first(monkeypatch, spinner):
    g = cpu_generator(monkeypatch, [spinner.pid])
    asyncio.run(g.sleep(1))
    time.sleep(0.1)
    assert state(spinner.pid) == "T" and g.engine.calls == []  # vLLM-CPU has no sleep mode: nothing asked of it

    seen: list[str] = []

    async def rpc(method, kwargs=None):  # the reload runs on a continued engine
        seen.append(state(spinner.pid))

    g.engine.collective_rpc = rpc
    asyncio.run(g.update_weights(1, "/w/v1"))
    assert seen and "T" not in seen and state(spinner.pid) != "T"


def test_a_cpu_generator_is_not_stopped_in_the_middle_of_a_load(monkeypatch, spinner):
    g = cpu_generator(monkeypatch, [spinner.pid])

    async def sleep_during_the_load() -> None:
        async def rpc(method, kwargs=None):
            await g.sleep(1)  # the learner's turn arrives while the version is loading

        g.engine.collective_rpc = rpc
        await g.update_weights(1, "/w/v1")

    asyncio.run(sleep_during_the_load())
    time.sleep(0.1)
    assert state(spinner.pid) != "T" and g._frozen == []


def test_shutdown_continues_a_stopped_engine_first(monkeypatch, spinner):
    g = cpu_generator(monkeypatch, [spinner.pid])
    asyncio.run(g.sleep(1))
    engine = g.engine
    asyncio.run(g.shutdown())
    time.sleep(0.1)
    assert engine.calls == ["shutdown"] and state(spinner.pid) != "T"


GENERATOR = """
import subprocess, sys, time
from agentrl.engine.generation.freeze import start_sentinel
# an engine that exits once its parent is gone, as vLLM's does (it watches a pipe from its parent)
child = subprocess.Popen([sys.executable, "-c", "import os, time\\nparent = os.getppid()\\nwhile os.getppid() == parent: pass"])
sentinel = start_sentinel()
print(child.pid, sentinel, flush=True)
time.sleep(600)
"""


def test_an_engine_stopped_when_its_generator_is_killed_is_continued_by_the_sentinel_and_ends():
    import os
    import signal

    import psutil

    generator = subprocess.Popen([sys.executable, "-c", GENERATOR], stdout=subprocess.PIPE, text=True)
    try:
        engine_pid, sentinel_pid = map(int, generator.stdout.readline().split())
        time.sleep(1.5)  # the sentinel has read the generator's descendants at least once
        assert freeze([engine_pid]) == [engine_pid]
        time.sleep(0.2)
        assert state(engine_pid) == "T"
        generator.kill()  # the generator dies while its engine is stopped
        generator.wait(10)
        deadline = time.monotonic() + 6  # well inside the sentinel's grace: the engine ends because it was continued
        while time.monotonic() < deadline and psutil.pid_exists(engine_pid) and psutil.Process(engine_pid).status() != psutil.STATUS_ZOMBIE:
            time.sleep(0.2)
        assert not psutil.pid_exists(engine_pid) or psutil.Process(engine_pid).status() == psutil.STATUS_ZOMBIE
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and psutil.pid_exists(sentinel_pid) and psutil.Process(sentinel_pid).status() != psutil.STATUS_ZOMBIE:
            time.sleep(0.2)
        assert not psutil.pid_exists(sentinel_pid) or psutil.Process(sentinel_pid).status() == psutil.STATUS_ZOMBIE
    finally:
        generator.kill()
        for pid in ("engine_pid", "sentinel_pid"):
            if pid in locals():
                try:
                    os.kill(locals()[pid], signal.SIGKILL)
                except ProcessLookupError:
                    pass
