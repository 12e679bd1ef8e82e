"""Warm bubblewrap workers: preloaded modules, fresh state per execution, replacement of broken
workers, infrastructure failures as SandboxError, bounded concurrency, and the speed-up."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import anyio
import pytest

from agentrl.errors import SandboxError
from agentrl.sandbox import BubblewrapSandbox, ExecResult, create_sandbox

from .conftest import arun, run

SandboxOf = Callable[[str], Any]
SOLVE = "import sympy\nx = sympy.Symbol('x')\nprint(sympy.solve(x**2 - 5*x + 6, x))\n"


def light(**kwargs: Any) -> BubblewrapSandbox:
    """A warm sandbox whose workers start fast (nothing to import)."""
    return BubblewrapSandbox(preload=[], warmup="", timeout_s=5.0, **kwargs)


def kill_worker(sb: BubblewrapSandbox) -> None:
    worker = next(iter(sb._pool.workers))
    assert worker.proc is not None
    os.killpg(worker.proc.pid, signal.SIGKILL)
    worker.proc.wait()


@pytest.mark.parametrize("loop", ["asyncio", "trio"])
def test_warm_worker_has_the_modules_already(sandbox_of: SandboxOf, loop: str) -> None:
    sb = sandbox_of("bubblewrap-warm")
    before = sb.stats.warm_runs
    r = run(sb, "import sys\nprint('sympy' in sys.modules, 'numpy' in sys.modules)\n" + SOLVE, loop)
    assert r.ok and r.stdout == "True True\n[2, 3]\n", r
    assert sb.stats.warm_runs == before + 1 and sb.stats.cold_runs == 0


def test_every_execution_starts_from_the_warm_state(sandbox_of: SandboxOf) -> None:
    sb = sandbox_of("bubblewrap-warm")
    poison = "import sympy, numpy, sys\nsympy.solve = None\nsys.modules.pop('numpy')\nX = 1\n"
    assert run(sb, poison).ok
    check = (
        "import sympy, sys, numpy\n"
        "print(sympy.solve is not None, 'numpy' in sys.modules, 'X' in globals())\n"
        "print(numpy.random.randint(1 << 30))\n"
    )
    first, second = run(sb, check), run(sb, check)
    assert first.stdout.splitlines()[0] == "True True False", first
    # The global RNG is reseeded in every execution (forks would otherwise repeat its numbers).
    assert first.stdout.splitlines()[1] != second.stdout.splitlines()[1]


def test_warm_runs_sympy_already_imported_where_a_fresh_interpreter_imports_it(sandbox_of: SandboxOf) -> None:
    """What makes a warm execution fast (benchmarks/sandbox.py measures how fast; a timing here
    would flip on a loaded machine): the fork already holds sympy, a fresh interpreter imports it."""
    warm, cold = sandbox_of("bubblewrap-warm"), sandbox_of("bubblewrap-exec")
    probe = "import sys\nprint('sympy' in sys.modules)\n" + SOLVE
    before = warm.stats.warm_runs
    w, c = run(warm, probe), run(cold, probe)
    assert w.ok and w.stdout == "True\n[2, 3]\n", w
    assert c.ok and c.stdout == "False\n[2, 3]\n", c
    assert warm.stats.warm_runs == before + 1 and cold.stats.warm_runs == 0


def test_crashed_worker_is_replaced() -> None:
    async def go() -> list[ExecResult]:
        async with light(max_concurrency=1) as sb:
            await sb.start()
            first = await sb.run("print(1)")
            kill_worker(sb)  # dies between executions
            # Found dead and replaced; while the replacement starts, runs use their own container.
            second = await sb.run("print(2)")
            assert sb.stats.workers_replaced == 1 and sb.stats.workers_started == 2, sb.stats
            await sb.start()
            third = await sb.run("print(3)")
            assert sb.stats.warm_runs == 2, sb.stats
            return [first, second, third]

    assert [r.stdout for r in arun(go)] == ["1\n", "2\n", "3\n"]


@pytest.mark.parametrize("loop", ["asyncio", "trio"])
def test_worker_dying_mid_execution_is_a_sandbox_error(loop: str) -> None:
    async def go() -> ExecResult:
        async with light(max_concurrency=1) as sb:
            await sb.start()
            errors: list[BaseException] = []

            async def victim() -> None:
                try:
                    await sb.run("import time\ntime.sleep(30)")
                except SandboxError as exc:
                    errors.append(exc)

            t0 = time.monotonic()
            async with anyio.create_task_group() as tg:
                tg.start_soon(victim)
                await anyio.sleep(0.5)
                kill_worker(sb)
            assert time.monotonic() - t0 < 5
            assert len(errors) == 1 and "died" in str(errors[0]), errors
            return await sb.run("print('replaced')")  # the sandbox carries on

    assert arun(go, loop).stdout == "replaced\n"


def test_worker_that_cannot_start_is_a_sandbox_error() -> None:
    async def go() -> None:
        async with BubblewrapSandbox(preload=["agentrl_no_such_module"], max_concurrency=1) as sb:
            await sb.start()

    with pytest.raises(SandboxError, match="agentrl_no_such_module"):
        arun(go)


def test_warm_up_failure_is_a_sandbox_error() -> None:
    async def go() -> None:
        async with BubblewrapSandbox(preload=[], warmup="1/0", max_concurrency=1) as sb:
            await sb.start()

    with pytest.raises(SandboxError, match="ZeroDivisionError"):
        arun(go)


def test_runs_before_the_workers_are_ready_use_their_own_container() -> None:
    async def go() -> tuple[ExecResult, BubblewrapSandbox]:
        sb = BubblewrapSandbox(max_concurrency=1)  # numpy and sympy: ~1 s to import
        async with sb:
            r = await sb.run("print('early')")
            await sb.start()
            late = await sb.run("print('late')")
            assert late.stdout == "late\n"
        return r, sb

    r, sb = arun(go)
    assert r.stdout == "early\n" and sb.stats.cold_runs == 1 and sb.stats.warm_runs == 1


def test_concurrency_is_bounded() -> None:
    async def go() -> tuple[float, int]:
        async with light(max_concurrency=2) as sb:
            await sb.start()

            async def one() -> None:
                assert (await sb.run("import time\ntime.sleep(0.3)")).ok

            t0 = time.monotonic()
            async with anyio.create_task_group() as tg:
                for _ in range(6):
                    tg.start_soon(one)
            return time.monotonic() - t0, len(sb._pool.workers)

    elapsed, workers = arun(go)
    assert elapsed >= 0.9 and workers == 2  # 6 runs of 0.3 s through 2 slots: three rounds


def test_engine_style_construction() -> None:
    sb = create_sandbox("bubblewrap", max_concurrency=2, timeout_s=3.0, memory_mb=256)
    assert isinstance(sb, BubblewrapSandbox) and sb.warm and sb.max_concurrency == 2
    arun(sb.aclose)
    cold = create_sandbox("bubblewrap", warm=False)
    assert isinstance(cold, BubblewrapSandbox) and not cold.warm
    arun(cold.aclose)


def test_an_idle_worker_killed_from_outside_is_reaped_counted_and_the_next_run_gets_a_fresh_one() -> None:
    async def go() -> tuple[int, int, int, ExecResult, int]:
        async with light(max_concurrency=1) as sb:
            await sb.start()
            assert (await sb.run("print(1)")).ok
            nothing = sb.reap_dead_workers()  # every worker alive: nothing to reap
            kill_worker(sb)  # dies while idle
            reaped = sb.reap_dead_workers()
            counted = sb.stats.workers_replaced
            after = await sb.run("print(2)")
            return nothing, reaped, counted, after, sb.stats.workers_replaced

    nothing, reaped, counted, after, total = arun(go)
    assert nothing == 0 and reaped == 1
    assert counted == 1  # said before any execution found it dead
    assert after.ok and after.stdout == "2\n", after
    assert total == 1  # counted once, not again by the next execution


@pytest.mark.parametrize("loop", ["asyncio", "trio"])
def test_cancelled_run_keeps_the_worker(loop: str) -> None:
    async def go() -> tuple[ExecResult, Any]:
        async with light(max_concurrency=1) as sb:
            await sb.start()
            with anyio.move_on_after(0.5):
                await sb.run("import time\ntime.sleep(30)")
                raise AssertionError("should have been cancelled")
            return await sb.run("print('next')"), sb.stats

    r, stats = arun(go, loop)
    assert r.stdout == "next\n" and stats.workers_replaced == 0 and stats.warm_runs == 2, stats


# What identifies an execution's tree from inside: its PID namespace and when its init started.
TREE_ID = "import os\nprint('tree', os.readlink('/proc/self/ns/pid'), open('/proc/1/stat').read().rsplit(')', 1)[1].split()[19])\n"


def tree_of(r: ExecResult) -> str:
    line = next(x for x in r.stdout.splitlines() if x.startswith("tree "))
    return line.split(" ", 1)[1]


@pytest.mark.parametrize("loop", ["asyncio", "trio"])
def test_a_reused_tree_carries_nothing_over(loop: str) -> None:
    """Every execution first looks for what an earlier one could have left, then leaves files,
    System V shared memory, a POSIX message queue and a daemon behind. Executions that run in a
    tree an earlier one used (reset in between) find none of it.

    Which trees the server reuses depends on the order in which resets finish (a slow reset can
    find the pool already full), so every execution both leaves and looks: any reuse is a check.
    """
    code = TREE_ID + (
        "import ctypes, os, time\n"
        "print('files', [n for n in os.listdir('/tmp') if n != 'main.py'], os.listdir('/dev/shm'))\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "rt = ctypes.CDLL('librt.so.1', use_errno=True)\n"
        "print('shm', libc.shmget(0x5eed, 0, 0))\n"
        "print('mq', rt.mq_open(b'/left', 0o2))\n"
        "print('procs', sorted(int(p) for p in os.listdir('/proc') if p.isdigit() and int(p) not in (1, os.getpid())))\n"
        "open('/tmp/left', 'w').write('x'); open('/dev/shm/left', 'w').write('x')\n"
        "assert libc.shmget(0x5eed, 4096, 0o1666) >= 0\n"
        "assert rt.mq_open(b'/left', 0o100 | 0o2, 0o666, None) >= 0\n"  # O_CREAT | O_RDWR
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    while True: time.sleep(0.01)\n"
    )

    async def go() -> tuple[list[ExecResult], Any]:
        async with light(max_concurrency=1) as sb:
            await sb.start()
            results: list[ExecResult] = []
            for _ in range(24):  # until some tree has served three executions (or one failed)
                results.append(await sb.run(code))
                if not results[-1].ok or max(Counter(map(tree_of, results)).values()) >= 3:
                    break
            return results, sb.stats

    results, stats = arun(go, loop)
    assert all(r.ok for r in results), results[-1]
    trees = [tree_of(r) for r in results]
    assert max(Counter(trees).values()) >= 3 and stats.trees_reused >= 2, (stats, trees)
    for r in results:
        lines = dict(line.split(" ", 1) for line in r.stdout.splitlines())
        assert r.ok and lines["files"] == "[] []" and lines["shm"] == "-1" and lines["mq"] == "-1", r
        assert lines["procs"] == "[]", r


def test_the_code_holds_no_descriptor_of_the_worker() -> None:
    """The code's process holds its standard streams and its own channel (fd 1000), nothing
    else: no other tree's channel, no control socket, no namespace descriptor, no pipe of the
    server's (it is forked by the fork helper, which holds none of them), however many trees the
    worker has handed out before."""
    code = (
        "import os\n"
        "fds = [int(n) for n in os.listdir('/proc/self/fd')]\n"
        "held = {}\n"
        "for fd in fds:\n"
        "    try:\n"
        "        held[fd] = os.readlink('/proc/self/fd/%d' % fd)\n"
        "    except OSError:\n"
        "        pass\n"  # the descriptor listdir used, closed by now
        "print(sorted(held))\n"
        "print(held[1000].startswith('socket:'))\n"
    )

    async def go() -> list[ExecResult]:
        async with light(max_concurrency=1) as sb:
            await sb.start()
            return [await sb.run(code) for _ in range(5)]

    for r in arun(go):
        assert r.ok and r.stdout.splitlines() == ["[0, 1, 2, 1000]", "True"], r


@pytest.mark.parametrize("how", ["timeout", "crash"])
def test_a_tree_that_ended_badly_is_never_reused(how: str) -> None:
    """A tree whose execution ran into its deadline, or whose process was killed by a signal, is
    ended, not reset: no later execution runs in it."""
    bad = TREE_ID + ("import time\ntime.sleep(30)\n" if how == "timeout" else "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")

    async def go() -> tuple[ExecResult, list[ExecResult], Any]:
        async with BubblewrapSandbox(preload=[], warmup="", timeout_s=1.0, max_concurrency=1) as sb:
            await sb.start()
            first = await sb.run(bad)
            later = [await sb.run(TREE_ID) for _ in range(8)]
            return first, later, sb.stats

    first, later, stats = arun(go)
    assert (first.timed_out if how == "timeout" else first.exit_code == 128 + signal.SIGKILL), first
    assert stats.trees_reused > 0 and stats.workers_replaced == 0, stats  # reuse goes on for the others
    assert all(r.ok for r in later) and tree_of(first) not in {tree_of(r) for r in later}


def test_a_tree_the_host_left_without_its_release_is_never_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server resets and reuses a tree only when the host's last message on its channel was
    RELEASE. A host that closes the channel without it (a code path that shut the channel, a
    host that went away) may still act on the tree's init: the server kills that init instead."""
    from agentrl.sandbox import _tree

    monkeypatch.setattr(_tree.AsyncConn, "release", lambda self: None)

    async def go() -> tuple[list[ExecResult], Any]:
        async with light(max_concurrency=1) as sb:
            await sb.start()
            return [await sb.run(TREE_ID) for _ in range(6)], sb.stats

    results, stats = arun(go)
    assert all(r.ok for r in results), results
    assert stats.trees_reused == 0, stats
    assert len({tree_of(r) for r in results}) == 6
