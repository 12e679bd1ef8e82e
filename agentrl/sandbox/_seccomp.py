"""The sandbox's system-call filter: built with libseccomp (PyPI's ``pyseccomp``) for bubblewrap,
and as a Docker seccomp profile (:func:`docker_profile`) for the Docker backend.

The filter closes the kernel interfaces behind most recent local privilege escalations. It is
installed where the user's code starts, after the sandbox's own setup, which needs some of these
calls (``unshare``, ``mount``, ``setns`` to build and reset warm trees):

- per-execution mode: by bwrap itself (``--seccomp FD``), right before it starts the interpreter;
- warm mode and sessions: by the guest runtime (:func:`agentrl.sandbox.guest.limits.prepare_seccomp`), in
  two stages whose conjunction is this filter. The warm server's fork helper loads
  ``program(setup=True)`` once: the same filter, except that it lets the tree's process enter the
  tree's namespaces (``setns``) and make its user namespace (``unshare(CLONE_NEWUSER)``, nothing
  else). Every tree process inherits it from the fork, then, after that set-up and before it
  reads a request, adds :func:`lock_program`, which refuses exactly those (``EPERM``). Filters
  stack and the strictest answer wins, so the code meets this filter; loading the small second
  stage costs a fork microseconds, where the whole filter cost a fork a fresh compilation.

Every process the code starts inherits it, and it cannot be removed.

What it denies (``EPERM``, except ``clone3``: ``ENOSYS``, so that the C library falls back to
``clone``, whose flags the filter can inspect):

- everything Docker's default profile denies to an unprivileged container: module loading,
  ``kexec``, ``reboot``, clocks, ``swapon``, ``acct``, ``quotactl``, ``mount``/``umount``,
  ``pivot_root``, ``unshare``, ``setns``, ``ptrace``, ``process_vm_*``, ``kcmp``, ``bpf``,
  ``perf_event_open``, ``userfaultfd``, keyrings, NUMA policy calls, ``name_to_handle_at`` /
  ``open_by_handle_at``, ``lookup_dcookie``, ``ioperm``/``iopl``, ``sysfs``, ``ustat``,
  ``uselib``, ``vm86``, obsolete calls;
- the io_uring interface (``io_uring_setup``/``enter``/``register``) and the new mount API
  (``fsopen``, ``fsconfig``, ``fsmount``, ``fspick``, ``move_mount``, ``open_tree``,
  ``mount_setattr``);
- ``clone`` with any namespace flag (``CLONE_NEWUSER``, ``CLONE_NEWNS``, ``CLONE_NEWPID``,
  ``CLONE_NEWNET``, ``CLONE_NEWUTS``, ``CLONE_NEWIPC``, ``CLONE_NEWCGROUP``, ``CLONE_NEWTIME``):
  no nested user namespaces, no new namespaces of any kind;
- ``personality`` with a flag that changes the address space (no ASLR, page zero, executable
  reads...), as Docker's profile refuses them;
- system calls of any architecture but the native one (the process is killed);
- every system call libseccomp does not know (``ENOSYS``, as Docker's profile answers calls
  outside its allowlist): interfaces newer than the installed libseccomp stay closed until it
  names them. The filter is an allowlist: each call libseccomp knows for this architecture,
  less the denied ones, is allowed by a rule of its own.
"""

from __future__ import annotations

import errno
import functools
import tempfile

from agentrl.errors import SandboxUnavailable

__all__ = ["DENIED", "NAMESPACE_FLAGS", "SETUP_CALLS", "allowed", "describe", "docker_profile", "lock_program", "program"]

DENIED: tuple[str, ...] = (
    # Docker's default profile: denied to containers without extra capabilities
    "acct", "add_key", "bpf", "clock_adjtime", "clock_settime", "create_module", "delete_module", "finit_module",
    "get_kernel_syms", "get_mempolicy", "init_module", "ioperm", "iopl", "kcmp", "kexec_file_load", "kexec_load",
    "keyctl", "lookup_dcookie", "mbind", "mount", "move_pages", "name_to_handle_at", "nfsservctl",
    "open_by_handle_at", "perf_event_open", "pivot_root", "process_vm_readv", "process_vm_writev", "ptrace",
    "query_module", "quotactl", "reboot", "request_key", "set_mempolicy", "setns", "settimeofday", "stime",
    "swapon", "swapoff", "sysfs", "_sysctl", "umount", "umount2", "unshare", "uselib", "userfaultfd", "ustat",
    "vm86", "vm86old", "syslog", "vhangup", "afs_syscall", "tuxcall", "security", "lookup_dcookie",
    # beyond Docker's default: io_uring and the new mount API
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    "fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree", "mount_setattr",
    "quotactl_fd", "process_madvise", "pidfd_getfd",
)
"""System calls the filter refuses with EPERM (names unknown to this kernel's libseccomp are skipped)."""

NAMESPACE_FLAGS = (
    0x00000080  # CLONE_NEWTIME
    | 0x00020000  # CLONE_NEWNS
    | 0x02000000  # CLONE_NEWCGROUP
    | 0x04000000  # CLONE_NEWUTS
    | 0x08000000  # CLONE_NEWIPC
    | 0x10000000  # CLONE_NEWUSER
    | 0x20000000  # CLONE_NEWPID
    | 0x40000000  # CLONE_NEWNET
)
"""``clone`` flags that create a namespace: a ``clone`` with any of them is refused."""

SETUP_CALLS = ("setns", "unshare")
"""Denied calls that a warm tree's process needs for its own set-up: allowed by the set-up stage
(``program(setup=True)``; ``unshare`` with ``CLONE_NEWUSER`` alone), refused again by
:func:`lock_program` before the code runs."""
_CLONE_NEWUSER = 0x10000000


def _seccomp():  # type: ignore[no-untyped-def]
    try:
        import pyseccomp
    except (ImportError, OSError) as exc:  # the package, or libseccomp.so.2 behind it
        raise SandboxUnavailable(
            f"the sandbox's system-call filter needs libseccomp and the pyseccomp package ({exc}): "
            "apt-get install libseccomp2; pip install pyseccomp"
        ) from None
    return pyseccomp


_PERSONA_FLAGS = (
    0x0040000,  # ADDR_NO_RANDOMIZE: no ASLR
    0x0080000,  # FDPIC_FUNCPTRS
    0x0100000,  # MMAP_PAGE_ZERO: map page 0 (NULL-dereference exploits)
    0x0200000,  # ADDR_COMPAT_LAYOUT
    0x0400000,  # READ_IMPLIES_EXEC
    0x0800000,  # ADDR_LIMIT_32BIT
    0x1000000,  # SHORT_INODE
    0x2000000,  # WHOLE_SECONDS
    0x4000000,  # STICKY_TIMEOUTS
    0x8000000,  # ADDR_LIMIT_3GB
)
"""``personality`` flags that change the address space or its protections: setting any is refused
(the query ``personality(0xffffffff)`` and plain personas stay allowed, as in Docker's profile)."""


_PERSONA_ALL = 0
for _flag in _PERSONA_FLAGS:
    _PERSONA_ALL |= _flag
#: The query ``personality(0xffffffff)``, as the register holds it zero- or sign-extended.
_PERSONA_QUERIES = (0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF)
#: Arguments that are special-cased rather than simply allowed or denied.
_CONDITIONAL = ("clone", "clone3", "personality")


@functools.cache
def allowed() -> tuple[str, ...]:
    """The system calls allowed outright: every one libseccomp knows for the native architecture,
    less :data:`DENIED` and the conditional ones (``clone``, ``clone3``, ``personality``)."""
    sc = _seccomp()
    denied = set(DENIED) | set(_CONDITIONAL)
    names = []
    for number in range(1024):
        try:
            name = sc.resolve_syscall(sc.Arch.NATIVE, number)
        except (RuntimeError, ValueError, OSError):
            continue
        name = name.decode() if isinstance(name, bytes) else str(name)
        if name and name not in denied:
            names.append(name)
    return tuple(dict.fromkeys(names))


def _export(f) -> bytes:  # type: ignore[no-untyped-def]
    with tempfile.TemporaryFile() as out:
        f.export_bpf(out)
        out.seek(0)
        return out.read()


@functools.cache
def program(setup: bool = False) -> bytes:
    """The filter as a classic BPF program (what ``prctl(PR_SET_SECCOMP)`` loads), built once per
    process by libseccomp for the native architecture only: a system call made through another
    architecture's entry (32-bit ``int 0x80`` on x86-64, x32) kills the process (libseccomp's
    default for a foreign architecture). Calls it does not name are refused with ``ENOSYS``;
    rules are laid out as a binary tree (libseccomp's optimization level 2), so a call costs a
    few comparisons however long the allowlist.

    ``setup``: the warm trees' first stage, which also allows :data:`SETUP_CALLS` (see the module
    docstring); never the whole filter on its own."""
    sc = _seccomp()
    f = sc.SyscallFilter(sc.ERRNO(errno.ENOSYS))
    try:
        f.set_attr(sc.Attr.CTL_OPTIMIZE, 2)
    except (RuntimeError, ValueError, OSError):  # libseccomp < 2.5: a linear filter, still correct
        pass
    for name in allowed():
        f.add_rule(sc.ALLOW, name)
    deny = sc.ERRNO(errno.EPERM)
    if setup:
        f.add_rule(sc.ALLOW, "setns")
        f.add_rule(sc.ALLOW, "unshare", sc.Arg(0, sc.EQ, _CLONE_NEWUSER))
        f.add_rule(deny, "unshare", sc.Arg(0, sc.NE, _CLONE_NEWUSER))
    for name in dict.fromkeys(DENIED):
        if setup and name in SETUP_CALLS:
            continue
        try:
            f.add_rule(deny, name)
        except (RuntimeError, ValueError, OSError):  # not a system call of this architecture
            continue
    # one comparison per rule (libseccomp's limit): rules for the same call are alternatives
    for bit in range(32):
        if NAMESPACE_FLAGS >> bit & 1:
            f.add_rule(deny, "clone", sc.Arg(0, sc.MASKED_EQ, 1 << bit, 1 << bit))
    f.add_rule(sc.ALLOW, "clone", sc.Arg(0, sc.MASKED_EQ, NAMESPACE_FLAGS, 0))
    # clone3 (its flags are behind a pointer, out of the filter's reach) falls to the default,
    # ENOSYS, which makes the C library use clone.
    for flag in _PERSONA_FLAGS:  # the flag set, and bit 31 clear (bit 31 set: the query 0xffffffff)
        f.add_rule(deny, "personality", sc.Arg(0, sc.MASKED_EQ, flag | 0x80000000, flag))
    f.add_rule(sc.ALLOW, "personality", sc.Arg(0, sc.MASKED_EQ, _PERSONA_ALL, 0))
    for query in _PERSONA_QUERIES:
        f.add_rule(sc.ALLOW, "personality", sc.Arg(0, sc.EQ, query))
    return _export(f)


@functools.cache
def lock_program() -> bytes:
    """The warm trees' second stage: refuses :data:`SETUP_CALLS` with ``EPERM`` and allows
    everything else, which ``program(setup=True)``, loaded beneath it, decides. Alone it protects
    nothing; the two together are :func:`program`."""
    sc = _seccomp()
    f = sc.SyscallFilter(sc.ALLOW)
    for name in SETUP_CALLS:
        f.add_rule(sc.ERRNO(errno.EPERM), name)
    return _export(f)


_DOCKER_ARCH = {"x86_64": "SCMP_ARCH_X86_64", "aarch64": "SCMP_ARCH_AARCH64", "arm64": "SCMP_ARCH_AARCH64",
                "ppc64le": "SCMP_ARCH_PPC64LE", "s390x": "SCMP_ARCH_S390X", "riscv64": "SCMP_ARCH_RISCV64"}


@functools.cache
def docker_profile() -> str:
    """The same filter as a Docker seccomp profile (JSON, for ``--security-opt seccomp=...``): the
    same allowlist, denials and conditions as :func:`program`, unknown calls refused with
    ``ENOSYS``, for the native architecture only (a system call of another architecture is refused
    as Docker refuses unlisted architectures). The container's own machinery (the runner, the
    reaper) needs none of the denied calls."""
    import json
    import platform

    def masked(flag: int) -> dict[str, object]:
        return {"index": 0, "value": flag, "valueTwo": flag, "op": "SCMP_CMP_MASKED_EQ"}

    syscalls: list[dict[str, object]] = [
        {"names": list(allowed()), "action": "SCMP_ACT_ALLOW"},
        {"names": sorted(set(DENIED)), "action": "SCMP_ACT_ERRNO", "errnoRet": errno.EPERM},
    ]
    syscalls += [
        {"names": ["clone"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.EPERM, "args": [masked(1 << bit)]}
        for bit in range(32) if NAMESPACE_FLAGS >> bit & 1
    ]
    syscalls.append({"names": ["clone"], "action": "SCMP_ACT_ALLOW", "args": [
        {"index": 0, "value": NAMESPACE_FLAGS, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}]})
    syscalls.append({"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS})
    syscalls += [
        {"names": ["personality"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.EPERM,
         "args": [{"index": 0, "value": flag | 0x80000000, "valueTwo": flag, "op": "SCMP_CMP_MASKED_EQ"}]}
        for flag in _PERSONA_FLAGS
    ]
    syscalls += [
        {"names": ["personality"], "action": "SCMP_ACT_ALLOW", "args": [arg]}
        for arg in (
            {"index": 0, "value": _PERSONA_ALL, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"},
            *({"index": 0, "value": q, "valueTwo": 0, "op": "SCMP_CMP_EQ"} for q in _PERSONA_QUERIES),
        )
    ]
    arch = _DOCKER_ARCH.get(platform.machine())
    profile = {
        "defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": errno.ENOSYS,
        "architectures": [arch] if arch else [], "syscalls": syscalls,
    }
    return json.dumps(profile, separators=(",", ":"))


def describe() -> str:
    """One line for ``agentrl check --dry-run``: whether the filter can be built here, and its size."""
    try:
        n = len(program()) // 8
    except SandboxUnavailable as exc:
        return f"seccomp: unavailable ({exc})"
    return (
        f"seccomp: {n}-instruction allowlist filter (libseccomp; {len(allowed())} calls allowed), "
        f"namespaces, io_uring, bpf, ptrace, mount API and {len(set(DENIED))} calls denied, unknown calls refused"
    )
