"""Sessions (:class:`agentrl.sandbox.SandboxSession`) on every backend, on asyncio and trio."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from agentrl.errors import SandboxError
from agentrl.sandbox import ExecResult, SandboxSession, supports_sessions

from .conftest import BACKENDS, arun, comm_code, wait_none_named

SandboxOf = Callable[[str], Any]


@pytest.mark.parametrize("loop", ["asyncio", "trio"])
@pytest.mark.parametrize("kind", BACKENDS)
def test_state_survives_between_cells(sandbox_of: SandboxOf, kind: str, loop: str) -> None:
    sb = sandbox_of(kind)
    assert supports_sessions(sb)

    async def go() -> list[ExecResult]:
        async with sb.session() as s:
            assert isinstance(s, SandboxSession)
            return [
                await s.run("import math\nx = 41\ndef f(y):\n    return y + 1\n"),
                await s.run("x = f(x)\nprint(x, math.pi > 3)"),
                await s.run("open('notes.txt', 'w').write('kept')"),
                await s.run("print(open('notes.txt').read())"),
                await s.run("import sys\nsys.exit(3)"),  # ends the cell, not the session
                await s.run("print(x)"),
                await s.run("f(None)"),
            ]

    define, use, write, read, exited, after_exit, error = arun(go, loop)
    assert define.ok and define.stdout == "", define
    assert use.ok and use.stdout == "42 True\n", use
    assert write.ok and read.stdout == "kept\n", read
    assert exited.exit_code == 3 and not exited.state_lost, exited
    assert after_exit.ok and after_exit.stdout == "42\n", after_exit
    assert error.exit_code == 1 and not error.state_lost
    assert 'File "cell1.py", line 4, in f' in error.stderr and "TypeError" in error.stderr, error
    assert all(not r.state_lost and not r.timed_out for r in (define, use, write, read))


@pytest.mark.parametrize("kind", BACKENDS)
def test_deadline_ends_the_state_and_the_session_starts_over(sandbox_of: SandboxOf, kind: str) -> None:
    sb = sandbox_of(kind)
    name = "agt" + uuid.uuid4().hex[:12]

    async def go() -> list[ExecResult]:
        async with sb.session() as s:
            return [
                await s.run("x = 1"),
                await s.run(comm_code(name) + "import time\nwhile True:\n    time.sleep(0.1)", timeout_s=1),
                await s.run("print('x' in globals())"),
                await s.run("x = 2\nprint(x)"),
            ]

    t0 = time.monotonic()
    first, stuck, fresh, again = arun(go)
    assert time.monotonic() - t0 < 15
    assert first.ok and not first.state_lost
    assert stuck.timed_out and stuck.state_lost and stuck.exit_code is None, stuck
    assert fresh.ok and fresh.stdout == "False\n" and not fresh.state_lost, fresh
    assert again.ok and again.stdout == "2\n"
    assert wait_none_named(name) == []


@pytest.mark.parametrize("kind", BACKENDS)
def test_dying_interpreter_loses_the_state(sandbox_of: SandboxOf, kind: str) -> None:
    sb = sandbox_of(kind)

    async def go() -> list[ExecResult]:
        async with sb.session() as s:
            return [
                await s.run("x = 1"),
                await s.run("import os\nprint('bye', flush=True)\nos._exit(7)"),
                await s.run("print('x' in globals())"),
                await s.run("big = bytearray(1 << 34)"),  # a MemoryError is an ordinary result
                await s.run("print('alive')"),
            ]

    first, died, fresh, memory, alive = arun(go)
    assert died.exit_code == 7 and died.state_lost and died.stdout == "bye\n", died
    assert fresh.ok and fresh.stdout == "False\n"
    assert memory.memory_exceeded and not memory.state_lost, memory
    assert alive.ok and alive.stdout == "alive\n"


@pytest.mark.parametrize("kind", BACKENDS)
def test_cell_leftovers_are_killed_and_close_ends_everything(sandbox_of: SandboxOf, kind: str) -> None:
    sb = sandbox_of(kind)
    name = "agt" + uuid.uuid4().hex[:12]

    async def go() -> tuple[ExecResult, ExecResult]:
        s = sb.session()
        async with s:
            spawn = await s.run(
                comm_code(name) + "import subprocess, sys\n"
                "p = subprocess.Popen([sys.executable, '-S', '-c', 'import time; time.sleep(60)'])\n"
                "print('spawned')\n"
            )
            after = await s.run("print(p.poll() is not None)")  # the cell's child was killed
        with pytest.raises(SandboxError):
            await s.run("print(1)")
        return spawn, after

    spawn, after = arun(go)
    assert spawn.ok and spawn.stdout == "spawned\n", spawn
    assert after.ok and after.stdout == "True\n", after
    assert wait_none_named(name) == []


@pytest.mark.parametrize("kind", BACKENDS)
def test_session_output_is_capped_per_cell(sandbox_of: SandboxOf, kind: str) -> None:
    sb = sandbox_of(kind)

    async def go() -> tuple[ExecResult, ExecResult]:
        async with sb.session() as s:
            big = await s.run("print('y' * 100_000)")
            small = await s.run("print('z')")
        return big, small

    big, small = arun(go)
    assert big.ok and big.stdout_truncated and len(big.stdout) == sb.max_output_bytes
    assert small.ok and small.stdout == "z\n" and not small.stdout_truncated


def test_sessions_opened_at_once_on_a_fresh_warm_sandbox_all_open() -> None:
    """Before any worker is up, eight sessions start together on a sandbox of four workers:
    several wait on the same starting worker, and each gets a worker of its own (two waits on one
    worker's socket were refused: 'BusyResourceError: Another task is already reading from this
    resource', an infrastructure failure of an innocent episode)."""
    import anyio

    from agentrl.sandbox import BubblewrapSandbox

    from .conftest import SETTINGS

    sb = BubblewrapSandbox(warm=True, **{**SETTINGS, "max_concurrency": 4})

    async def go() -> list[Any]:
        out: list[Any] = [None] * 8

        async def one(i: int) -> None:
            try:
                async with sb.session() as s:
                    out[i] = await s.run(f"print({i} * 7)")
            except Exception as exc:  # noqa: BLE001 - the test reports what each one got
                out[i] = exc

        try:
            async with anyio.create_task_group() as tg:
                for i in range(8):
                    tg.start_soon(one, i)
        finally:
            await sb.aclose()
        return out

    results = arun(go)
    assert all(isinstance(r, ExecResult) and r.ok for r in results), results
    assert [r.stdout for r in results] == [f"{i * 7}\n" for i in range(8)]


def test_a_worker_polled_ready_while_another_task_waits_on_it_hands_out_a_tree() -> None:
    """One task waits for a starting worker (watching its socket) while another finds it ready by
    polling, as the pool's ``ready()`` does, and asks it for a tree at once: the two must take
    turns on the socket. Before, the second watched it too and was refused ('BusyResourceError:
    Another task is already reading from this resource'): seen in CI under load, in the test
    above, as an innocent session's infrastructure failure."""
    import anyio

    from agentrl.sandbox import BubblewrapSandbox

    from .conftest import SETTINGS

    sb = BubblewrapSandbox(warm=True, preload=[], warmup="", **{**SETTINGS, "max_concurrency": 1})

    async def go() -> str:
        worker = sb._pool.launch("full")
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(worker.wait_ready)  # watches the socket until the worker says ready
                for _ in range(10):
                    await anyio.sleep(0)  # it is watching now: a worker takes far longer to start
                deadline = time.monotonic() + 60
                while not worker.poll_ready():  # without yielding: the waiter cannot read first
                    assert time.monotonic() < deadline, "the worker did not start"
                    time.sleep(0.005)
                tree = await worker.take("session")
                tree.close()
            return "took a tree"
        finally:
            await sb.aclose()

    assert arun(go) == "took a tree"


