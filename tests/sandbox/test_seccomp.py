"""The sandbox's system-call filter (agentrl.sandbox._seccomp: libseccomp for bubblewrap, a profile for Docker), attacked from inside:
one test per property, on the per-execution and the warm mode and in sessions; and the same
attacks succeed without the filter (so these tests can fail)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from agentrl.sandbox import BubblewrapSandbox
from agentrl.sandbox._seccomp import DENIED, lock_program, program
from tests.sandbox.conftest import SETTINGS, run

FILTERED = ["bubblewrap-exec", "bubblewrap-warm", "docker"]  # docker: agentrl's profile (docker_profile)

#: Each attack prints "<return value> <errno>" of one system call through libc.
ATTACKS = {
    "nested user namespace": "print(L.unshare(0x10000000), E())",
    "new mount namespace": "print(L.unshare(0x00020000), E())",
    "clone into a new user namespace": "print(L.syscall(56, 0x10000000 | 17, 0, 0, 0, 0), E())",  # clone(CLONE_NEWUSER|SIGCHLD)
    "io_uring_setup": "p = (ctypes.c_char * 120)(); print(L.syscall(425, 8, p), E())",
    "bpf": "print(L.syscall(321, 0, 0, 0), E())",
    "userfaultfd": "print(L.syscall(323, 0), E())",
    "perf_event_open": "print(L.syscall(298, 0, 0, -1, -1, 0), E())",
    "keyctl": "print(L.syscall(250, 0, 0, 0, 0, 0), E())",
    "ptrace": "print(L.ptrace(16, 1, 0, 0), E())",  # PTRACE_ATTACH to pid 1
    "setns": "print(L.setns(0, 0), E())",
    "mount": "print(L.mount(b'none', b'/tmp', b'tmpfs', 0, None), E())",
    "fsopen": "print(L.syscall(430, b'tmpfs', 0), E())",
    "personality without ASLR": "print(L.personality(0x0040000), E())",
}
PRELUDE = "import ctypes\nL = ctypes.CDLL(None, use_errno=True)\nE = ctypes.get_errno\n"
EPERM = 1


def refused(result: Any) -> bool:
    value, err = result.stdout.split()
    return int(value) == -1 and int(err) == EPERM


@pytest.mark.parametrize("attack", list(ATTACKS))
@pytest.mark.parametrize("kind", FILTERED)
def test_the_filter_refuses_the_call(sandbox_of: Any, kind: str, attack: str) -> None:
    r = run(sandbox_of(kind), PRELUDE + ATTACKS[attack])
    assert r.exit_code == 0, r.stderr
    assert refused(r), r.stdout


@pytest.mark.parametrize("kind", FILTERED)
def test_a_session_runs_under_the_filter_from_its_first_cell_to_its_last(sandbox_of: Any, kind: str) -> None:
    async def go() -> list[Any]:
        async with sandbox_of(kind).session() as s:
            first = await s.run(PRELUDE + ATTACKS["nested user namespace"])
            later = await s.run(ATTACKS["io_uring_setup"])
            return [first, later]

    results = anyio.run(go)
    assert all(refused(r) for r in results), [r.stdout + r.stderr for r in results]


@pytest.mark.parametrize("kind", FILTERED)
def test_what_code_ordinarily_does_still_works(sandbox_of: Any, kind: str) -> None:
    code = (
        "import os, subprocess, threading, ctypes\n"
        "t = threading.Thread(target=lambda: None); t.start(); t.join()\n"
        "out = subprocess.run(['sh', '-c', 'echo child'], capture_output=True, text=True).stdout.strip()\n"
        "pid = os.fork()\n"
        "if pid == 0: os._exit(7)\n"
        "squares = [abs(-1), os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])]\n"
        "print(out, squares, ctypes.CDLL(None).personality(0xffffffff) >= 0)\n"
    )
    r = run(sandbox_of(kind), code)
    assert r.exit_code == 0 and r.stdout.strip() == "child [1, 7] True", r.stdout + r.stderr


@pytest.mark.parametrize("warm", [False, True])
def test_without_the_filter_the_same_attacks_succeed(warm: bool) -> None:
    """The control: with ``seccomp=False`` a nested user namespace and io_uring are available,
    so the tests above fail if the filter is not installed."""

    async def go() -> list[Any]:
        sb = BubblewrapSandbox(**SETTINGS, warm=warm, preload=[], seccomp=False)
        try:
            return [await sb.run(PRELUDE + ATTACKS[a]) for a in ("nested user namespace", "io_uring_setup")]
        finally:
            await sb.aclose()

    results = anyio.run(go)
    assert [int(r.stdout.split()[0]) for r in results][0] == 0, results[0].stdout + results[0].stderr
    assert int(results[1].stdout.split()[0]) >= 0, results[1].stdout + results[1].stderr  # an io_uring fd


def test_the_program_is_built_by_libseccomp_and_names_its_denials() -> None:
    prog = program()
    assert len(prog) % 8 == 0 and len(prog) // 8 > len(set(DENIED))  # one instruction per rule at least
    assert {"io_uring_setup", "bpf", "userfaultfd", "perf_event_open", "keyctl", "kexec_load", "mount", "pivot_root",
            "move_mount", "fsopen", "unshare", "setns", "ptrace"} <= set(DENIED)


def _unknown_but_implemented() -> int:
    """A system call number this kernel implements but libseccomp does not name (so the filter's
    allowlist leaves it out): the host's own call answers something other than ENOSYS."""
    import ctypes

    import pyseccomp

    libc = ctypes.CDLL(None, use_errno=True)
    for number in range(430, 600):
        try:
            if pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, number):
                continue
        except Exception:
            pass
        ctypes.set_errno(0)
        # arguments that make every candidate fail harmlessly (null pointers, zero lengths, bad fds)
        if libc.syscall(number, -1, 0, 0, 0, 0, 0) == -1 and ctypes.get_errno() == ENOSYS:
            continue
        return number
    raise AssertionError("no system call of this kernel is unknown to libseccomp: update the test")


ENOSYS = 38


@pytest.mark.parametrize("kind", FILTERED)
def test_a_call_libseccomp_does_not_know_is_refused(sandbox_of: Any, kind: str) -> None:
    """The filter is an allowlist: a call newer than the installed libseccomp (this kernel has
    some) answers ENOSYS inside, whatever it would do outside."""
    number = _unknown_but_implemented()
    r = run(sandbox_of(kind), PRELUDE + f"print(L.syscall({number}, -1, 0, 0, 0, 0, 0), E())")
    assert r.stdout.split() == ["-1", str(ENOSYS)], (number, r.stdout, r.stderr)


_STAGES = """
import ctypes, json, sys
L = ctypes.CDLL(None, use_errno=True)
class Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
def load(hexprog):
    raw = bytes.fromhex(hexprog)
    buf = ctypes.create_string_buffer(raw, len(raw))
    prog = Prog(len(raw) // 8, ctypes.cast(buf, ctypes.c_void_p))
    assert L.prctl(38, 1, 0, 0, 0) == 0 and L.prctl(22, 2, ctypes.byref(prog), 0, 0) == 0
def probe():
    out = {}
    for name, call in [("setns", lambda: L.setns(0, 0)), ("unshare user", lambda: L.unshare(0x10000000)),
                       ("unshare mount", lambda: L.unshare(0x00020000)), ("bpf", lambda: L.syscall(321, 0, 0, 0))]:
        ctypes.set_errno(0)
        out[name] = (call(), ctypes.get_errno())
    return out
load(sys.argv[1])
first = probe()
load(sys.argv[2])
print(json.dumps([first, probe()]))
"""


def test_the_warm_stages_stack_into_the_filter() -> None:
    """Warm trees load the filter in two stages: the first lets the tree's process enter the
    tree's namespaces and make its user namespace (and nothing else the filter denies), the
    second, added before the code runs, refuses those too (the pair is :func:`program`)."""
    import json
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-I", "-c", _STAGES, program(setup=True).hex(), lock_program().hex()],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode == 0, done.stderr
    setup, locked = json.loads(done.stdout)
    assert setup["setns"][1] != EPERM and setup["unshare user"] == [0, 0]  # fd 0 is no namespace: EINVAL
    assert setup["unshare mount"] == [-1, EPERM] and setup["bpf"] == [-1, EPERM]
    assert all(value == [-1, EPERM] for value in locked.values()), locked
    assert len(lock_program()) // 8 < 20  # small: loading it costs a fork next to nothing
