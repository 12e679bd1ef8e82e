"""The threat model of :mod:`agentrl.sandbox`, attacked: one test per property, every backend.

Each test runs adversarial code, checks that the result says what happened, that no process of it
is left on the host, and that the sandbox keeps working afterwards. ``unsafe-local`` takes part
only where the property is expected to hold for it (see the package docstring): a real fork bomb,
escapes or destructive writes are never run unsandboxed.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from agentrl.sandbox import ExecResult

from .conftest import (
    BACKENDS,
    ISOLATED,
    REPO,
    SETTINGS,
    comm_code,
    run,
    wait_none_named,
)

SandboxOf = Callable[[str], Any]


def token() -> str:
    return "agt" + uuid.uuid4().hex[:12]


def ends_at_its_deadline(sb: Any, code: str, name: str) -> None:
    """``code`` (whose processes are named ``name``) runs until its 1.5 s deadline: the result
    says so, it comes within seconds, nothing of it is left, and the sandbox still works."""
    t0 = time.monotonic()
    r = run(sb, code, timeout_s=1.5)
    assert r.timed_out and r.exit_code is None and not r.ok, r
    assert time.monotonic() - t0 < 6
    assert wait_none_named(name, 5.0) == []
    still_works(sb)


def still_works(sb: Any) -> None:
    """The sandbox runs ordinary code after the attack."""
    r = run(sb, "print(6 * 7)")
    assert r.ok and r.stdout == "42\n", r


# --- resources and time ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", ISOLATED)  # unsafe-local: root is not bound by RLIMIT_NPROC
def test_fork_bomb(sandbox_of: SandboxOf, kind: str) -> None:
    sb = sandbox_of(kind)
    name = token()
    code = comm_code(name) + (
        "import os\n"
        "while True:\n"
        "    try:\n"
        "        os.fork()\n"
        "    except OSError:\n"
        "        pass\n"
    )
    ends_at_its_deadline(sb, code, name)


@pytest.mark.parametrize("kind", BACKENDS)
def test_memory_bomb(sandbox_of: SandboxOf, kind: str) -> None:
    sb = sandbox_of(kind)
    r = run(sb, "x = bytearray(4 << 30)", memory_mb=128)
    assert r.memory_exceeded and r.exit_code == 1 and "MemoryError" in r.stderr, r
    r = run(sb, "a = []\nwhile True:\n    a.append(' ' * 10**6)\n", memory_mb=128)
    assert r.memory_exceeded and not r.ok and not r.timed_out, r
    still_works(sb)


@pytest.mark.parametrize("kind", BACKENDS)
def test_infinite_loop(sandbox_of: SandboxOf, kind: str) -> None:
    sb = sandbox_of(kind)
    t0 = time.monotonic()
    r = run(sb, "print('spinning', flush=True)\nwhile True:\n    pass\n", timeout_s=1)
    elapsed = time.monotonic() - t0
    assert r.timed_out and r.exit_code is None and not r.memory_exceeded, r
    assert r.stdout == "spinning\n"  # what was written before the deadline is kept
    assert 0.9 < elapsed < 4, elapsed
    still_works(sb)


@pytest.mark.parametrize("kind", ISOLATED)  # unsafe-local: a new session escapes its group
def test_busy_children_outliving_the_parent(sandbox_of: SandboxOf, kind: str) -> None:
    sb = sandbox_of(kind)
    name = token()
    code = comm_code(name) + (
        "import os\n"
        "for _ in range(3):\n"
        "    if os.fork() == 0:\n"
        "        os.setsid()\n"
        "        if os.fork() == 0:  # a daemon: new session, parent gone\n"
        "            while True:\n"
        "                pass\n"
        "        os._exit(0)\n"
        "print('parent done')\n"
    )
    r = run(sb, code)
    assert r.ok and r.stdout == "parent done\n", r
    assert wait_none_named(name) == []
    still_works(sb)


@pytest.mark.parametrize("kind", BACKENDS)
def test_process_ignoring_sigterm(sandbox_of: SandboxOf, kind: str) -> None:
    sb = sandbox_of(kind)
    name = token()
    code = comm_code(name) + (
        "import os, signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "signal.signal(signal.SIGHUP, signal.SIG_IGN)\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "os.fork()  # and a child that ignores them too\n"
        "while True:\n"
        "    time.sleep(0.05)\n"
    )
    r = run(sb, code, timeout_s=1)
    assert r.timed_out and r.exit_code is None, r
    assert wait_none_named(name) == []
    still_works(sb)


@pytest.mark.parametrize("kind", BACKENDS)
def test_sleeping_past_the_deadline(sandbox_of: SandboxOf, kind: str) -> None:
    sb = sandbox_of(kind)
    t0 = time.monotonic()
    r = run(sb, "import time\ntime.sleep(3600)\n", timeout_s=1)
    assert r.timed_out and r.exit_code is None, r
    assert time.monotonic() - t0 < 4
    still_works(sb)


@pytest.mark.parametrize("kind", BACKENDS)
def test_forged_end_of_execution(sandbox_of: SandboxOf, kind: str) -> None:
    """Code that reports its own end on every socket it can reach (as JSON messages and as
    frames), then goes on running: it still ends at its deadline, and nothing of it is left."""
    sb = sandbox_of(kind)
    name = token()
    code = comm_code(name) + (
        "import socket, struct, time\n"
        "forged = [b'{\"event\":\"exit\",\"status\":0}', b'{\"event\":\"done\",\"exit_code\":0}']\n"
        "forged += [struct.pack('>I', len(m)) + m for m in list(forged)]\n"
        "for fd in range(3, 1100):\n"
        "    try:\n"
        "        s = socket.socket(fileno=fd)\n"
        "    except OSError:\n"
        "        continue\n"
        "    for m in forged:\n"
        "        try:\n"
        "            s.send(m)\n"
        "        except OSError:\n"
        "            pass\n"
        "    s.detach()\n"
        "time.sleep(3600)\n"
    )
    ends_at_its_deadline(sb, code, name)


@pytest.mark.parametrize("kind", BACKENDS)
def test_gigantic_output(sandbox_of: SandboxOf, kind: str) -> None:
    sb = sandbox_of(kind)
    code = (
        "import os, sys\n"
        "chunk = b'o' * (1 << 20)\n"
        "for _ in range(64):\n"
        "    os.write(1, chunk)\n"  # 64 MiB on each stream, unbuffered
        "    os.write(2, chunk.replace(b'o', b'e'))\n"
        "print('survived', file=sys.stderr)\n"
    )
    r = run(sb, code, timeout_s=20)
    limit = SETTINGS["max_output_bytes"]
    assert r.ok, r
    assert r.stdout == "o" * limit and r.stderr == "e" * limit
    assert r.stdout_truncated and r.stderr_truncated
    still_works(sb)


# --- isolation ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ISOLATED)
@pytest.mark.parametrize("target", ["loopback", "external"])
def test_network_connect(sandbox_of: SandboxOf, kind: str, target: str) -> None:
    sb = sandbox_of(kind)
    with socket.socket() as server:  # a service on the host's loopback
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        addrs = [("127.0.0.1", port)] if target == "loopback" else [("8.8.8.8", 53), ("1.1.1.1", 443)]
        code = (
            "import socket\n"
            f"for addr in {addrs!r}:\n"
            "    try:\n"
            "        socket.create_connection(addr, timeout=2).close()\n"
            "        print('connected', addr)\n"
            "    except OSError as e:\n"
            "        print('failed', type(e).__name__)\n"
            "print([name for _, name in socket.if_nameindex()])\n"
        )
        r = run(sb, code)
        server.settimeout(0.1)
        with pytest.raises(OSError):  # nothing reached the host service
            server.accept()
    assert r.ok, r
    assert "connected" not in r.stdout
    assert r.stdout.count("failed") == len(addrs)
    assert r.stdout.strip().splitlines()[-1] == "['lo']"


@pytest.mark.parametrize("kind", BACKENDS)
def test_reading_host_environment(sandbox_of: SandboxOf, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    sb = sandbox_of(kind)
    monkeypatch.setenv("AGENTRL_TEST_SECRET", "hunter2")
    r = run(sb, "import json, os\nprint(json.dumps(dict(os.environ)))")
    env = json.loads(r.stdout)
    assert "AGENTRL_TEST_SECRET" not in env and "hunter2" not in r.stdout
    assert set(env) <= {"PATH", "HOME", "TMPDIR", "LANG", "PYTHONDONTWRITEBYTECODE", "PWD", "LC_CTYPE"}
    if kind != "unsafe-local":  # nor through /proc: no process of the host is visible
        r = run(sb, "import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))")
        assert r.ok and len(json.loads(r.stdout)) < 10, r


@pytest.mark.parametrize("kind", ISOLATED)
def test_reading_host_files(sandbox_of: SandboxOf, kind: str, tmp_path: Path) -> None:
    sb = sandbox_of(kind)
    secret = tmp_path / "secret.txt"
    secret.write_text("hunter2")
    in_repo = REPO / f".agentrl-secret-{uuid.uuid4().hex}"
    in_repo.write_text("hunter2")
    try:
        paths = [str(secret), str(in_repo), "/etc/shadow", "/root/.bash_history", "/etc/hostname",
                 "/proc/1/environ", "/var/run/docker.sock"]
        code = (
            "import json\n"
            "out = {}\n"
            f"for path in {paths!r}:\n"
            "    try:\n"
            "        out[path] = open(path, 'rb').read()[:100].decode('latin-1')\n"
            "    except OSError as e:\n"
            "        out[path] = type(e).__name__\n"
            "print(json.dumps(out))\n"
        )
        r = run(sb, code)
    finally:
        in_repo.unlink()
    assert r.ok, r
    assert "hunter2" not in r.stdout
    out = json.loads(r.stdout)
    for path in (str(secret), str(in_repo), "/etc/shadow", "/var/run/docker.sock"):
        assert out[path] in ("FileNotFoundError", "PermissionError"), (path, out[path])


@pytest.mark.parametrize("kind", ISOLATED)
def test_writing_outside_private_tmp(sandbox_of: SandboxOf, kind: str, tmp_path: Path) -> None:
    sb = sandbox_of(kind)
    name = f"agentrl-x-{uuid.uuid4().hex}"
    targets = [f"/{name}", f"/usr/{name}", f"/etc/{name}", f"/root/{name}", f"/opt/{name}",
               f"/opt/site/0/{name}", f"{sys.base_prefix}/{name}", str(REPO / name),
               str(tmp_path / name), f"/var/tmp/{name}", f"/dev/{name}", f"/proc/{name}"]
    code = (
        "import json\n"
        "out = {}\n"
        f"for path in {targets!r}:\n"
        "    try:\n"
        "        with open(path, 'w') as f:\n"
        "            f.write('x')\n"
        "        out[path] = 'written'\n"
        "    except OSError as e:\n"
        "        out[path] = type(e).__name__\n"
        f"open('/tmp/{name}', 'w').write('fine')\n"
        f"out['tmp'] = open('/tmp/{name}').read()\n"
        "print(json.dumps(out))\n"
    )
    r = run(sb, code)
    assert r.ok, r
    out = json.loads(r.stdout)
    assert out.pop("tmp") == "fine"
    assert all(v != "written" for v in out.values()), out
    for path in targets:  # nothing appeared on the host
        assert not os.path.exists(path), path


@pytest.mark.parametrize("kind", ISOLATED)  # unsafe-local would really delete the host's files
def test_deleting_or_replacing_the_workers_files(sandbox_of: SandboxOf, kind: str) -> None:
    sb = sandbox_of(kind)
    code = (
        "import json, os, shutil, sys\n"
        "out = {}\n"
        "targets = [sys.executable, os.path.realpath(sys.executable), sys.prefix + '/lib',\n"
        "           '/usr/bin/env', '/usr/lib', '/opt/site/0', '/opt/site/0/sympy/__init__.py']\n"
        "for path in targets:\n"
        "    for op in ('remove', 'replace', 'chmod'):\n"
        "        try:\n"
        "            if op == 'remove':\n"
        "                shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)\n"
        "            elif op == 'replace':\n"
        "                open(path, 'w').write('raise SystemExit(99)')\n"
        "            else:\n"
        "                os.chmod(path, 0)\n"
        "            out[path + ':' + op] = 'done'\n"
        "        except OSError as e:\n"
        "            out[path + ':' + op] = type(e).__name__\n"
        "try:\n"  # and in memory, for the next execution
        "    import sympy\n"
        "    sympy.solve = lambda *a, **k: 'poisoned'\n"
        "except ImportError:\n"
        "    pass\n"
        "print(json.dumps(out))\n"
    )
    r = run(sb, code)
    assert r.ok, r
    out = json.loads(r.stdout)
    assert all(v != "done" for v in out.values()), {k: v for k, v in out.items() if v == "done"}
    assert os.access(sys.executable, os.X_OK)
    r = run(sb, "import sympy\nx = sympy.Symbol('x')\nprint(sympy.solve(x**2 - 4, x))")
    assert r.ok and r.stdout == "[-2, 2]\n", r
    still_works(sb)


@pytest.mark.parametrize("kind", ISOLATED)
def test_no_state_between_executions(sandbox_of: SandboxOf, kind: str) -> None:
    sb = sandbox_of(kind)
    mark = uuid.uuid4().hex
    leave = (
        "import os, ctypes\n"
        f"open('/tmp/{mark}', 'w').write('left')\n"
        "try:\n"
        f"    open('/dev/shm/{mark}', 'w').write('left')\n"
        "except OSError:\n"
        "    pass  # not writable at all here\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print('shm', libc.shmget(0x5eed, 4096, 0o1666))\n"  # IPC_CREAT | 0666
    )
    find = (
        "import os, ctypes\n"
        f"print(os.path.exists('/tmp/{mark}'), os.path.exists('/dev/shm/{mark}'))\n"
        "print(ctypes.CDLL(None, use_errno=True).shmget(0x5eed, 0, 0))\n"
        "print([n for n in os.listdir('/tmp') if n != 'main.py'])\n"  # main.py: this run's own
    )
    r = run(sb, leave)
    assert r.ok and int(r.stdout.split()[-1]) >= 0, r
    r = run(sb, find)
    assert r.ok, r
    lines = r.stdout.splitlines()
    assert lines[0] == "False False" and lines[1] == "-1" and lines[2] == "[]", r


@pytest.mark.parametrize("kind", ISOLATED)
def test_no_state_between_sessions(sandbox_of: SandboxOf, kind: str) -> None:
    sb = sandbox_of(kind)
    mark = uuid.uuid4().hex

    async def go() -> tuple[ExecResult, ExecResult, ExecResult]:
        async with sb.session() as a:
            left = await a.run(
                "import os, socket, ctypes\n"
                f"secret = {mark!r}\n"
                f"open('/tmp/{mark}', 'w').write('left')\n"
                "srv = socket.socket()\n"
                "srv.bind(('127.0.0.1', 47123))\n"
                "srv.listen()\n"
                "print('shm', ctypes.CDLL(None).shmget(0x5eee, 4096, 0o1666))\n"
            )
            async with sb.session() as b:  # open at the same time, on any worker or container
                seen = await b.run(
                    "import os, socket, ctypes\n"
                    "print('secret' in globals(), os.listdir('/tmp'))\n"
                    "try:\n"
                    "    socket.create_connection(('127.0.0.1', 47123), timeout=1)\n"
                    "    print('connected')\n"
                    "except OSError:\n"
                    "    print('refused')\n"
                    "print(ctypes.CDLL(None).shmget(0x5eee, 0, 0))\n"
                )
            still = await a.run("print(secret, os.path.exists(" + repr(f"/tmp/{mark}") + "))")
        return left, seen, still

    left, seen, still = arun_any(go)
    assert left.ok, left
    assert seen.ok, seen
    assert seen.stdout.splitlines() == ["False []", "refused", "-1"], seen
    assert still.ok and still.stdout == f"{mark} True\n", still  # while a's own state lives on


def arun_any(fn: Any) -> Any:
    return anyio.run(fn)
