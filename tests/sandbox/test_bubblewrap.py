"""Tests of agentrl.sandbox that run the real bubblewrap (skipped where ``bwrap`` is missing)."""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import anyio
import pytest

from agentrl.errors import ConfigError, SandboxError, SandboxUnavailable
from agentrl.sandbox import (
    BubblewrapSandbox,
    ExecResult,
    Sandbox,
    UnsafeLocalSandbox,
    create_sandbox,
)

REPO = Path(__file__).resolve().parents[2]
BACKENDS = ["asyncio", "trio"]
T = TypeVar("T")

def arun(fn: Callable[[], Awaitable[T]], backend: str = "asyncio") -> T:
    return anyio.run(fn, backend=backend)


@pytest.fixture(scope="module")
def sandbox() -> Iterator[BubblewrapSandbox]:
    sb = BubblewrapSandbox(timeout_s=5.0, memory_mb=256)
    yield sb
    anyio.run(sb.aclose)


def run(sb: Sandbox, code: str, backend: str = "asyncio", **kwargs: Any) -> ExecResult:
    async def go() -> ExecResult:
        return await sb.run(code, **kwargs)

    return arun(go, backend)


def processes_with(token: str) -> list[int]:
    """Pids of live host processes whose command line contains ``token``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if token.encode() in cmdline:
            found.append(int(name))
    return found


def wait_gone(token: str, within_s: float = 2.0) -> list[int]:
    deadline = time.monotonic() + within_s
    while (left := processes_with(token)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


# --- basics -------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_prints_output(sandbox: BubblewrapSandbox, backend: str) -> None:
    r = run(sandbox, "import sys\nprint('hello', 6 * 7)\nprint('warn', file=sys.stderr)", backend)
    assert r.ok and r.exit_code == 0 and not r.timed_out and not r.memory_exceeded
    assert r.stdout == "hello 42\n"
    assert r.stderr == "warn\n"
    assert not r.stdout_truncated and not r.stderr_truncated
    assert 0 < r.wall_s < 5


def test_failing_code_gives_exit_code_and_traceback(sandbox: BubblewrapSandbox) -> None:
    r = run(sandbox, "def f():\n    return 1 / 0\n\nf()\n")
    assert not r.ok and r.exit_code == 1 and not r.timed_out
    assert "Traceback (most recent call last)" in r.stderr
    assert 'File "main.py", line 4' in r.stderr and "return 1 / 0" in r.stderr
    assert r.stderr.rstrip().endswith("ZeroDivisionError: division by zero")
    assert "<string>" not in r.stderr and "prelude" not in r.stderr


def test_syntax_error_and_exit_statuses(sandbox: BubblewrapSandbox) -> None:
    r = run(sandbox, "x = (\n")
    assert r.exit_code == 1 and "SyntaxError" in r.stderr and "main.py" in r.stderr
    assert run(sandbox, "exit(3)").exit_code == 3
    r = run(sandbox, "import sys; sys.exit('bye')")
    assert r.exit_code == 1 and r.stderr == "bye\n"
    r = run(sandbox, "import os, signal; os.kill(os.getpid(), signal.SIGTERM)")
    assert r.exit_code == 128 + 15 and not r.timed_out and not r.memory_exceeded


def test_stdin_is_empty_and_unicode_roundtrips(sandbox: BubblewrapSandbox) -> None:
    r = run(sandbox, "print('héllo ✓')\ntry:\n    input()\nexcept EOFError:\n    print('eof')")
    assert r.ok and r.stdout == "héllo ✓\neof\n"


def test_large_code(sandbox: BubblewrapSandbox) -> None:
    payload = "x" * 3_000_000
    r = run(sandbox, f"s = {payload!r}\nprint(len(s))")
    assert r.ok and r.stdout == "3000000\n"


# --- deadline -----------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_busy_loop_times_out(sandbox: BubblewrapSandbox, backend: str) -> None:
    t0 = time.monotonic()
    r = run(sandbox, "print('started')\nwhile True:\n    pass\n", backend, timeout_s=1)
    elapsed = time.monotonic() - t0
    assert r.timed_out and r.exit_code is None and not r.ok and not r.memory_exceeded
    assert r.stdout == "started\n"  # output written before the deadline is kept
    assert 0.9 < elapsed < 3


def test_sleep_past_deadline(sandbox: BubblewrapSandbox) -> None:
    t0 = time.monotonic()
    r = run(sandbox, "import time\ntime.sleep(60)", timeout_s=1)
    assert r.timed_out and r.exit_code is None
    assert time.monotonic() - t0 < 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_child_that_outlives_the_main_process_is_killed(sandbox: BubblewrapSandbox, backend: str) -> None:
    token = f"agentrl-orphan-{uuid.uuid4().hex}"
    code = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-S', '-c', 'import time; time.sleep(60)', "
        f"{token!r}], start_new_session=True)\n"
        "time.sleep(0.3)\n"
        "print('child alive' if p.poll() is None else 'child died')\n"
    )
    r = run(sandbox, code, backend)
    assert r.ok and r.stdout == "child alive\n", r
    assert wait_gone(token) == []


def test_process_tree_is_killed_at_deadline() -> None:
    token = f"agentrl-tree-{uuid.uuid4().hex}"
    code = (
        "import os, subprocess, sys, time\n"
        "for _ in range(3):\n"
        "    subprocess.Popen([sys.executable, '-S', '-c', 'import time; time.sleep(60)', "
        f"{token!r}], start_new_session=True)\n"
        "while True:\n"
        "    time.sleep(1)\n"
    )
    seen: list[int] = []

    async def go() -> ExecResult:
        async with BubblewrapSandbox(timeout_s=2.0) as sb:
            result: list[ExecResult] = []

            async def runner() -> None:
                result.append(await sb.run(code))

            async with anyio.create_task_group() as tg:
                tg.start_soon(runner)
                with anyio.move_on_after(1.8):
                    while len(seen) < 3:  # the detection itself works: the children are visible
                        seen[:] = processes_with(token)
                        await anyio.sleep(0.05)
            return result[0]

    r = arun(go)
    assert len(seen) == 3
    assert r.timed_out and r.exit_code is None
    assert wait_gone(token) == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_cancelling_run_kills_the_sandbox(backend: str) -> None:
    token = f"agentrl-cancel-{uuid.uuid4().hex}"

    async def go() -> None:
        async with BubblewrapSandbox(timeout_s=30.0) as sb:
            with anyio.move_on_after(1.0):
                await sb.run(
                    "import subprocess, sys\n"
                    f"subprocess.run([sys.executable, '-S', '-c', 'import time; time.sleep(60)', {token!r}])"
                )
                raise AssertionError("run should have been cancelled")

    arun(go, backend)
    assert wait_gone(token) == []


def test_fork_bomb_is_contained() -> None:
    token = f"agentrl-forkbomb-{uuid.uuid4().hex}"
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    # exec first, so that the bomb and every child it forks carry the token in their command line
    code = f"import os, sys\nos.execv(sys.executable, [sys.executable, '-S', '-c', {bomb!r}, {token!r}])\n"
    seen: list[int] = []

    async def go() -> ExecResult:
        async with BubblewrapSandbox(max_processes=16) as sb:
            result: list[ExecResult] = []

            async def runner() -> None:
                result.append(await sb.run(code, timeout_s=1))

            async with anyio.create_task_group() as tg:
                tg.start_soon(runner)
                with anyio.move_on_after(1.5):
                    while len(seen) < 4:  # the bomb really forks
                        seen[:] = processes_with(token)
                        await anyio.sleep(0.02)
            return result[0]

    t0 = time.monotonic()
    r = arun(go)
    assert len(seen) >= 4, seen
    assert r.timed_out and time.monotonic() - t0 < 4
    assert wait_gone(token) == []  # nothing of it is left on the host


def test_max_processes_is_enforced() -> None:
    code = (
        "import os, time\n"
        "n = 0\n"
        "try:\n"
        "    for _ in range(40):\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(2)\n"
        "            os._exit(0)\n"
        "        n += 1\n"
        "except OSError as e:\n"
        "    print('limited', n)\n"
    )

    async def go() -> ExecResult:
        async with BubblewrapSandbox(max_processes=8) as sb:
            return await sb.run(code)

    r = arun(go)
    assert r.ok and r.stdout.startswith("limited "), r
    # 8 processes at most: the main one and up to 7 children (bwrap's own may count, as non-root)
    assert 5 <= int(r.stdout.split()[1]) <= 7, r


# --- isolation ----------------------------------------------------------------------------


def test_no_network(sandbox: BubblewrapSandbox) -> None:
    with socket.socket() as server:  # a service on the host's loopback
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        code = (
            "import socket\n"
            f"for addr in [('127.0.0.1', {port}), ('8.8.8.8', 53), ('1.1.1.1', 443)]:\n"
            "    try:\n"
            "        socket.create_connection(addr, timeout=2).close()\n"
            "        print('connected', addr)\n"
            "    except OSError as e:\n"
            "        print('failed', addr, type(e).__name__)\n"
            "print([name for _, name in socket.if_nameindex()])\n"
        )
        r = run(sandbox, code)
    assert r.ok, r
    assert "connected" not in r.stdout
    assert r.stdout.count("failed") == 3
    assert r.stdout.strip().splitlines()[-1] == "['lo']"


def test_host_environment_is_not_visible(sandbox: BubblewrapSandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTRL_SECRET", "hunter2")
    r = run(sandbox, "import json, os\nprint(json.dumps(dict(os.environ)))")
    env = json.loads(r.stdout)
    assert "AGENTRL_SECRET" not in env
    assert set(env) <= {"PATH", "HOME", "LANG", "PYTHONDONTWRITEBYTECODE", "PWD", "LC_CTYPE"}
    assert env["HOME"] == "/tmp"


def test_unprivileged_identity(sandbox: BubblewrapSandbox) -> None:
    code = (
        "import os\n"
        "status = dict(l.split(':\\t', 1) for l in open('/proc/self/status').read().splitlines() if ':\\t' in l)\n"
        "print(os.getuid(), os.geteuid(), os.getgid(), os.getgroups(), status['CapEff'].strip(), "
        "status['CapPrm'].strip(), status['NoNewPrivs'].strip(), os.getpid())\n"
    )
    r = run(sandbox, code)
    uid, euid, gid, groups, capeff, capprm, nnp, pid = r.stdout.split(" ", 7)[:8]
    assert (uid, euid, gid) == ("65534", "65534", "65534")
    assert capeff == capprm == "0000000000000000"
    assert nnp == "1"
    assert int(pid) < 10  # a PID namespace of its own


def test_filesystem_is_minimal_and_read_only(sandbox: BubblewrapSandbox) -> None:
    code = (
        "import json, os\n"
        "out = {}\n"
        "for path in ['/usr/agentrl-x', '/root/agentrl-x', '/agentrl-x', '/etc/agentrl-x', "
        f"{str(REPO / 'agentrl-x')!r}]:\n"
        "    try:\n"
        "        open(path, 'w').write('x')\n"
        "        out[path] = 'written'\n"
        "    except OSError as e:\n"
        "        out[path] = type(e).__name__\n"
        "try:\n"
        "    out['/root'] = sorted(os.listdir('/root'))\n"
        "except OSError as e:\n"
        "    out['/root'] = type(e).__name__\n"
        f"out['repo'] = os.path.exists({str(REPO)!r})\n"
        "out['passwd'] = os.path.exists('/etc/passwd')\n"
        "out['home'] = os.path.exists('/home')\n"
        "out['top'] = sorted(os.listdir('/'))\n"
        "open('/tmp/ok', 'w').write('fine')\n"
        "out['tmp'] = open('/tmp/ok').read()\n"
        "print(json.dumps(out))\n"
    )
    r = run(sandbox, code)
    assert r.ok, r
    out = json.loads(r.stdout)
    for path in ["/usr/agentrl-x", "/root/agentrl-x", "/agentrl-x", "/etc/agentrl-x", str(REPO / "agentrl-x")]:
        assert out[path] != "written", path
    assert not (REPO / "agentrl-x").exists()
    assert out["repo"] is False and out["passwd"] is False and out["home"] is False
    # /root holds at most the path down to the interpreter's prefix (e.g. .pyenv), nothing else.
    prefix = Path(sys.base_prefix).resolve()
    allowed = {prefix.parts[2]} if prefix.parts[:2] == ("/", "root") else set()
    assert out["/root"] == "PermissionError" or set(out["/root"]) <= allowed
    assert set(out["top"]) <= {"usr", "bin", "lib", "lib64", "sbin", "etc", "proc", "dev", "tmp", "root", "opt"}
    assert out["tmp"] == "fine"


def test_tmp_is_private_to_each_execution(sandbox: BubblewrapSandbox) -> None:
    assert run(sandbox, "open('/tmp/note', 'w').write('secret')").ok
    r = run(sandbox, "import os\nprint(os.path.exists('/tmp/note'))")
    assert r.stdout == "False\n"


def test_file_size_limit(sandbox: BubblewrapSandbox) -> None:
    r = run(sandbox, "open('/tmp/big', 'wb').write(b'x' * (100 << 20))")
    assert r.exit_code == 1 and ("File too large" in r.stderr or "No space left" in r.stderr)


# --- resources ----------------------------------------------------------------------------


def test_memory_bomb(sandbox: BubblewrapSandbox) -> None:
    r = run(sandbox, "x = bytearray(1 << 30)", memory_mb=128)
    assert r.memory_exceeded and not r.ok and r.exit_code == 1 and "MemoryError" in r.stderr
    r = run(sandbox, "a = []\nwhile True:\n    a.append(' ' * 10**6)\n", memory_mb=128, timeout_s=5)
    assert r.memory_exceeded and not r.ok


def test_killed_by_sigkill_counts_as_memory(sandbox: BubblewrapSandbox) -> None:
    r = run(sandbox, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert r.exit_code == 137 and r.memory_exceeded and not r.timed_out


def test_gigantic_output_is_truncated() -> None:
    code = (
        "import sys\n"
        "for _ in range(200):\n"
        "    sys.stdout.write('o' * 100_000)\n"
        "    sys.stderr.write('e' * 100_000)\n"
        "print('done')\n"
    )

    async def go() -> ExecResult:
        async with BubblewrapSandbox(max_output_bytes=1000) as sb:
            return await sb.run(code)

    r = arun(go)
    assert r.ok, r
    assert r.stdout == "o" * 1000 and r.stderr == "e" * 1000
    assert r.stdout_truncated and r.stderr_truncated


@pytest.mark.parametrize("backend", BACKENDS)
def test_concurrent_runs(backend: str) -> None:
    async def go() -> list[ExecResult]:
        results: dict[int, ExecResult] = {}
        async with BubblewrapSandbox(max_concurrency=4) as sb:

            async def one(i: int) -> None:
                code = f"import time\nt0 = time.time()\ntime.sleep(0.2)\nprint({i} * {i}, t0, time.time())"
                results[i] = await sb.run(code)

            async with anyio.create_task_group() as tg:
                for i in range(8):
                    tg.start_soon(one, i)
            return [results[i] for i in range(8)]

    results = arun(go, backend)
    assert all(r.ok for r in results), results
    assert [r.stdout.split()[0] for r in results] == [str(i * i) for i in range(8)]
    # each execution's own [start, end] (the wall clock is the host's): the most that overlapped
    spans = [tuple(map(float, r.stdout.split()[1:])) for r in results]
    most = max(sum(1 for a, b in spans if a <= t < b) for t, _ in spans)
    assert 2 <= most <= 4, spans  # they ran concurrently, never more than max_concurrency at once


# --- errors of the sandbox itself ---------------------------------------------------------


def test_unknown_kind_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="bubblewrap.*unsafe-local"):
        create_sandbox("nope")


def test_create_sandbox_builds_bubblewrap() -> None:
    sb = create_sandbox("bubblewrap", timeout_s=2.0)
    assert isinstance(sb, BubblewrapSandbox) and isinstance(sb, Sandbox)
    arun(sb.aclose)


def test_missing_bwrap_raises_unavailable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
        BubblewrapSandbox()
    with pytest.raises(SandboxUnavailable):
        create_sandbox("bubblewrap")


def test_bwrap_setup_failure_is_a_sandbox_error() -> None:
    async def go() -> None:
        async with BubblewrapSandbox() as sb:
            sb._static_args = [*sb._static_args, "--ro-bind", "/nonexistent-agentrl", "/x"]
            await sb.run("print(1)")

    with pytest.raises(SandboxError, match="nonexistent-agentrl"):
        arun(go)


def test_code_imitating_bwrap_errors_is_not_an_infra_failure(sandbox: BubblewrapSandbox) -> None:
    r = run(sandbox, "import sys\nprint(\"bwrap: Can't find source path /x: No such file\", file=sys.stderr)\nsys.exit(1)")
    assert r.exit_code == 1 and r.stderr.startswith("bwrap:")


def test_run_after_aclose_raises() -> None:
    async def go() -> None:
        sb = BubblewrapSandbox()
        await sb.aclose()
        await sb.run("print(1)")

    with pytest.raises(SandboxError):
        arun(go)


def test_bad_arguments_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="timeout_s"):
        BubblewrapSandbox(timeout_s=0)
    with pytest.raises(ConfigError, match="max_concurrency"):
        create_sandbox("bubblewrap", max_concurrency=0)
    with pytest.raises(ConfigError):
        create_sandbox("bubblewrap", bogus=1)


# --- the unsafe local sandbox -------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_unsafe_local_sandbox(backend: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTRL_SECRET", "hunter2")
    with caplog.at_level(logging.WARNING):
        sb = create_sandbox("unsafe-local", timeout_s=5.0, max_output_bytes=300)
    assert isinstance(sb, UnsafeLocalSandbox)
    assert any("UNSANDBOXED" in rec.getMessage() for rec in caplog.records)

    async def go() -> list[ExecResult]:
        async with sb:
            return [
                await sb.run("import os\nprint('AGENTRL_SECRET' in os.environ)"),
                await sb.run("1/0"),
                await sb.run("while True: pass", timeout_s=1),
                await sb.run("x = bytearray(1 << 30)", memory_mb=128),
                await sb.run("print('y' * 10_000)"),
            ]

    env, fail, loop, mem, big = arun(go, backend)
    assert env.ok and env.stdout == "False\n"
    assert fail.exit_code == 1 and "ZeroDivisionError" in fail.stderr
    assert loop.timed_out and loop.exit_code is None
    assert mem.memory_exceeded
    assert big.stdout == "y" * 300 and big.stdout_truncated
