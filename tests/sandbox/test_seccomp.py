"""The sandbox's system-call filter (agentrl.sandbox._seccomp: libseccomp for bubblewrap, a profile for Docker), attacked from inside:
one test per property, on the per-execution and the warm mode and in sessions; and the control:
the same attacks, on every backend, without the filter, get another answer from the kernel (so
these tests fail if the filter is missing).

The filter refuses with ``EPERM``, which is also what the kernel answers a process that lacks a
capability: a refusal alone does not show that the filter refused. So every execution also reports
``Seccomp:``/``Seccomp_filters:`` from ``/proc/self/status`` (2 and at least one filter: a filter
is installed) and, for attacks the kernel refuses with ``EPERM`` anyway, a *probe*: the same system
call with arguments the kernel rejects with another errno before it looks at any permission (a bad
flag, a missing path, no such process). Seccomp decides before the kernel reads the arguments, so
under the filter the probe answers ``EPERM`` too; without it, something else.
"""

from __future__ import annotations

import errno
import json
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest

from agentrl.sandbox import BubblewrapSandbox
from agentrl.sandbox._seccomp import DENIED, lock_program, program
from tests.sandbox.conftest import SETTINGS, arun, run

FILTERED = ["bubblewrap-exec", "bubblewrap-warm", "docker"]  # docker: agentrl's profile (docker_profile)

#: Each attack is one system call through libc (``L``), as an expression.
ATTACKS = {
    "nested user namespace": "L.unshare(0x10000000)",
    "new mount namespace": "L.unshare(0x00020000)",
    "clone into a new user namespace": "L.syscall(56, 0x10000000 | 17, 0, 0, 0, 0)",  # clone(CLONE_NEWUSER|SIGCHLD)
    "io_uring_setup": "L.syscall(425, 8, (ctypes.c_char * 120)())",
    "bpf": "L.syscall(321, 0, 0, 0)",
    "userfaultfd": "L.syscall(323, 1)",  # UFFD_USER_MODE_ONLY: what an unprivileged process may open
    "perf_event_open": "L.syscall(298, 0, 0, -1, -1, 0)",
    "keyctl": "L.syscall(250, 0, 0, 0, 0, 0)",
    "ptrace": "L.ptrace(16, 1, 0, 0)",  # PTRACE_ATTACH to pid 1
    "setns": "L.setns(0, 0)",
    "mount": "L.mount(b'none', b'/tmp', b'tmpfs', 0, None)",
    "fsopen": "L.syscall(430, b'tmpfs', 0)",
    "personality without ASLR": "L.personality(0x0040000)",
}
#: Attacks that get through without the filter (they return a namespace, a descriptor, a child...).
ESCAPES = {"nested user namespace", "clone into a new user namespace", "io_uring_setup", "userfaultfd",
           "personality without ASLR"}
#: For attacks the kernel itself refuses here with ``EPERM`` (no capability): the same call with
#: arguments the kernel rejects otherwise, first (``EINVAL``, ``ESRCH``, ``ENOENT``).
PROBES = {
    "new mount namespace": "L.unshare(0x00020000 | 0x1)",  # an undefined flag: EINVAL before any check
    "ptrace": "L.ptrace(16, 0, 0, 0)",  # no process 0: ESRCH
    "mount": "L.mount(b'none', b'/no/such/dir', b'tmpfs', 0, None)",  # the target is looked up first: ENOENT
}
#: Refused by the kernel with ``EPERM`` however it is called: fsopen checks CAP_SYS_ADMIN before
#: it reads an argument. Inside the sandbox only the ``Seccomp`` lines tell the filter's refusal
#: from the kernel's; :func:`test_the_program_refuses_what_the_kernel_would_allow` shows the
#: filter itself refusing it where the kernel allows it.
NO_PROBE = {"fsopen"}
PRELUDE = "import ctypes\nL = ctypes.CDLL(None, use_errno=True)\nE = ctypes.get_errno\n"
EPERM = errno.EPERM
REFUSED = [-1, EPERM]


def attack_code(attack: str) -> str:
    """Code that prints, as JSON, the answers ``[return value, errno]`` of the attack and of its
    probe (the attack's own where it has none: an escape that got through changes what a second
    try answers), and ``[Seccomp, Seccomp_filters]``."""
    return PRELUDE + f"""
import json, os, re
def call(f):
    ctypes.set_errno(0)
    return [f(), E()]
status = open("/proc/self/status").read()
seccomp = [int(re.search(rf"^{{key}}:\\s*(\\d+)", status, re.M).group(1)) for key in ("Seccomp", "Seccomp_filters")]
me = os.getpid()
probe = call(lambda: {PROBES.get(attack, "None")})
answer = call(lambda: {ATTACKS[attack]})
probe = answer if probe[0] is None else probe
if os.getpid() != me:  # the child of a clone that got through
    os._exit(0)
print(json.dumps({{"attack": answer, "probe": probe, "seccomp": seccomp}}))
"""


def outcome(sb: Any, attack: str) -> dict[str, Any]:
    r = run(sb, attack_code(attack))
    assert r.exit_code == 0, r.stdout + r.stderr
    return json.loads(r.stdout.splitlines()[-1])


@pytest.mark.parametrize("attack", list(ATTACKS))
@pytest.mark.parametrize("kind", FILTERED)
def test_the_filter_refuses_the_call(sandbox_of: Any, kind: str, attack: str) -> None:
    got = outcome(sandbox_of(kind), attack)
    assert got["attack"] == REFUSED and got["probe"] == REFUSED, got
    mode, filters = got["seccomp"]
    assert mode == 2 and filters >= 1, got  # SECCOMP_MODE_FILTER


@pytest.mark.parametrize("kind", FILTERED)
def test_a_session_runs_under_the_filter_from_its_first_cell_to_its_last(sandbox_of: Any, kind: str) -> None:
    async def go() -> list[Any]:
        async with sandbox_of(kind).session() as s:
            first = await s.run(attack_code("nested user namespace"))
            later = await s.run(attack_code("io_uring_setup"))
            return [first, later]

    results = anyio.run(go)
    got = [json.loads(r.stdout.splitlines()[-1]) for r in results]
    assert all(g["attack"] == REFUSED and g["seccomp"][0] == 2 for g in got), got


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


def _unfiltered(kind: str) -> Any:
    """A sandbox of that backend like conftest's, but without the filter: bubblewrap with
    ``seccomp=False``; Docker with ``seccomp=unconfined`` (no profile at all, not even Docker's
    default), for its own containers only."""
    if kind == "docker":
        from agentrl.sandbox import docker as docker_backend

        class UnconfinedDocker(docker_backend.DockerSandbox):
            def _create_sync(self) -> str:  # the profile is chosen where a container is created
                real = docker_backend.docker_profile
                docker_backend.docker_profile = lambda: "unconfined"  # type: ignore[assignment]
                try:
                    return super()._create_sync()
                finally:
                    docker_backend.docker_profile = real

        sb: Any = UnconfinedDocker(**SETTINGS)
    else:
        sb = BubblewrapSandbox(**SETTINGS, warm=kind == "bubblewrap-warm", preload=[], seccomp=False)
    arun(sb.start)  # warm: the executions below are served by warm workers
    return sb


@pytest.fixture(scope="module")
def unfiltered_of(request: pytest.FixtureRequest) -> Iterator[Callable[[str], Any]]:
    made: dict[str, Any] = {}

    def get(kind: str) -> Any:
        if kind not in made:
            if kind == "docker":
                request.getfixturevalue("docker_engine")
            made[kind] = _unfiltered(kind)
        return made[kind]

    yield get
    for sb in made.values():
        arun(sb.aclose)


@pytest.mark.parametrize("attack", list(ATTACKS))
@pytest.mark.parametrize("kind", FILTERED)
def test_without_the_filter_the_same_attacks_get_another_answer(
    sandbox_of: Any, unfiltered_of: Callable[[str], Any], kind: str, attack: str
) -> None:
    """The control, for every attack on every backend: the same code in the same sandbox less the
    filter. No filter is installed there, the escapes succeed, and every other attack (or its
    probe) gets an answer other than ``EPERM`` from the kernel, so the refusals above are the
    filter's."""
    filtered = outcome(sandbox_of(kind), attack)
    bare = outcome(unfiltered_of(kind), attack)
    assert filtered["seccomp"][0] == 2 and bare["seccomp"][1] < filtered["seccomp"][1], (filtered, bare)
    assert filtered["attack"] == filtered["probe"] == REFUSED, filtered
    if attack in ESCAPES:
        assert bare["attack"][0] >= 0, bare  # a namespace, a child, an io_uring or userfaultfd fd, the old persona
    if attack in NO_PROBE:
        # the kernel refuses it with EPERM too (no CAP_SYS_ADMIN): only the Seccomp lines above
        # tell the two refusals apart here
        assert bare["attack"] == REFUSED, bare
    else:  # the probe is the attack itself where the kernel does not refuse that with EPERM
        assert bare["probe"] != REFUSED, bare


_CAPABLE = """
import ctypes, json, os, signal, sys, time
L = ctypes.CDLL(None, use_errno=True)
class Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
def call(f):
    ctypes.set_errno(0)
    return [f(), ctypes.get_errno()]
def attach():
    pid = os.fork()
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    try:
        return call(lambda: L.ptrace(16, pid, 0, 0))  # PTRACE_ATTACH
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
def probe():
    return {"fsopen": call(lambda: L.syscall(430, b"tmpfs", 1)),  # FSOPEN_CLOEXEC; a context, nothing mounted
            "new mount namespace": call(lambda: L.unshare(0x00020000)),
            "mount": call(lambda: L.mount(b"none", b"/", None, 0x40000 | 0x4000, None)),  # MS_PRIVATE|MS_REC of its own /
            "ptrace": attach()}
# a user and a mount namespace of its own: every capability there, nothing outside
assert L.unshare(0x10000000 | 0x00020000) == 0, ctypes.get_errno()
before = probe()
raw = bytes.fromhex(sys.argv[1])
buf = ctypes.create_string_buffer(raw, len(raw))
prog = Prog(len(raw) // 8, ctypes.cast(buf, ctypes.c_void_p))
assert L.prctl(38, 1, 0, 0, 0) == 0 and L.prctl(22, 2, ctypes.byref(prog), 0, 0) == 0
print(json.dumps([before, probe()]))
"""


def test_the_program_refuses_what_the_kernel_would_allow() -> None:
    """The attacks the sandbox's kernel refuses with EPERM anyway (no capability there), in a
    process that has the capability (in a user namespace of its own, on the host): allowed
    before the filter is loaded, refused after."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-I", "-c", _CAPABLE, program().hex()], capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode == 0, done.stderr
    before, after = json.loads(done.stdout)
    assert set(before) == NO_PROBE | set(PROBES), before
    assert all(value[0] >= 0 for value in before.values()), before
    assert all(value == REFUSED for value in after.values()), after


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
