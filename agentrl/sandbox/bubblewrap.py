"""A sandbox that runs each execution in a fresh bubblewrap (``bwrap``) container.

See :mod:`agentrl.sandbox` for the threat model. Per execution, ``bwrap`` builds an empty root on a
tmpfs and mounts into it, read-only, only what the interpreter needs (``/usr``, the ``/bin``,
``/lib``, ``/lib64`` links or directories, ``/etc/alternatives``, ``/etc/ld.so.cache`` and the
interpreter's own prefix), plus a private ``/proc``, a minimal ``/dev`` and a size-capped tmpfs
``/tmp`` as the working directory. Every namespace is unshared (no network at all: only a loopback
interface of its own), the environment is cleared, and the code runs as uid/gid 65534 with no
capabilities under rlimits applied by a small prelude before the code (see
:mod:`agentrl.sandbox.base`).

Running as root needs one extra step. ``bwrap --unshare-user`` maps the sandbox's uid to the
caller's uid, so under root the sandboxed process would still be host uid 0, for which the kernel
does not enforce ``RLIMIT_NPROC`` (a fork bomb would go unchecked) and which owns every root-owned
file that is bound in. So under root the sandbox pre-creates, once per concurrency slot, a user
namespace mapping ``0 -> 0`` and ``65534 -> 65534``; ``bwrap --userns`` enters it as uid 0 with only
``CAP_SETUID``/``CAP_SETGID`` (to build the mounts, which may need to reach into ``/root``), and the
prelude then drops to uid/gid 65534 (host uid 65534, no capabilities left) before any of the code
runs. One namespace per slot keeps the process count per execution (the kernel counts processes per
user namespace and uid). The two capabilities stay in the code's *inheritable* set (bwrap puts them
there), which is inert: no permitted, effective or ambient capabilities, and ``no_new_privs``. (``bwrap --userns ... --uid 65534`` would be simpler, but bubblewrap 0.8
fails there: it calls ``setuid`` before ``setgid``.) Not root: plain ``bwrap --unshare-all --uid
65534``, where the host uid is the caller's and ``RLIMIT_NPROC`` applies normally.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence

from agentrl.errors import SandboxError, SandboxUnavailable
from agentrl.sandbox.base import (
    ExecResult,
    _base_python,
    _check_settings,
    _Limits,
    _LoopLocal,
    _python_argv,
    _run_process,
    _run_settings,
    _to_result,
)

__all__ = ["BubblewrapSandbox"]

log = logging.getLogger(__name__)

#: The unprivileged identity the code runs as (``nobody``/``nogroup`` on Debian).
SANDBOX_UID = 65534
#: Size of the private ``/tmp`` tmpfs of each execution (bytes of host memory at most).
TMPFS_BYTES = 128 * 1024 * 1024
#: The environment inside the sandbox (everything else is cleared).
SANDBOX_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/tmp",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
}
#: System paths bound read-only when present (symlinks, e.g. merged-/usr ``/lib -> usr/lib``, are
#: recreated as symlinks).
SYSTEM_PATHS = ("/usr", "/bin", "/lib", "/lib64", "/etc/alternatives", "/etc/ld.so.cache")

_INSTALL_HINT = (
    "bubblewrap (`bwrap`) is not installed or not on PATH; install it with "
    "`apt-get install bubblewrap` (Debian/Ubuntu) or `dnf install bubblewrap` (Fedora), "
    "or choose another sandbox kind"
)

_PRINT_PREFIXES = "import sys; print(sys.base_prefix); print(sys.base_exec_prefix)"

# Creates a user namespace and waits on stdin, so that the parent (root) can write its uid/gid maps
# and open /proc/<pid>/ns/user. 0x10000000 is CLONE_NEWUSER.
_UNSHARE_HELPER = (
    "import ctypes, os, sys\n"
    "ok = ctypes.CDLL(None, use_errno=True).unshare(0x10000000) == 0\n"
    "os.write(1, b'1' if ok else os.strerror(ctypes.get_errno()).encode())\n"
    "sys.stdin.read()\n"
)


class BubblewrapSandbox:
    """Runs each execution in a fresh ``bwrap`` container as an unprivileged user (Linux only).

    Args:
        max_concurrency: most executions running at once; further ``run`` calls wait for a slot.
        timeout_s: default wall-clock deadline per execution, in seconds.
        memory_mb: default address-space limit (RLIMIT_AS) per process, in MiB.
        max_output_bytes: how much of stdout, and of stderr, is kept per execution (bytes).
        max_processes: most processes/threads the code may have at once (RLIMIT_NPROC, counted per
            execution), the interpreter's main thread included.
        python: interpreter to run inside (path or name on PATH); default: the base interpreter
            of the running Python (not its virtualenv: site-packages of a venv are not visible).
            Its installation prefix is bound read-only at the same path.

    Raises:
        SandboxUnavailable: ``bwrap`` is not installed (the message says how to install it), or,
            under root, user namespaces cannot be created.
        SandboxError: the interpreter cannot be found or run.
        ConfigError: an argument is out of range.

    Use from one event loop at a time; ``await sandbox.aclose()`` (or ``async with``) when done.
    """

    def __init__(
        self,
        *,
        max_concurrency: int = 4,
        timeout_s: float = 10.0,
        memory_mb: int = 512,
        max_output_bytes: int = 16384,
        max_processes: int = 64,
        python: str | None = None,
    ) -> None:
        _check_settings(
            max_concurrency=max_concurrency, timeout_s=timeout_s, memory_mb=memory_mb,
            max_output_bytes=max_output_bytes, max_processes=max_processes,
        )
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            raise SandboxUnavailable(_INSTALL_HINT)
        self.timeout_s = float(timeout_s)
        self.memory_mb = int(memory_mb)
        self.max_output_bytes = int(max_output_bytes)
        self.max_processes = int(max_processes)
        self.max_concurrency = int(max_concurrency)
        self._bwrap = bwrap
        self._python, prefixes = _resolve_python(python)
        self._privileged = os.geteuid() == 0
        self._limiter = _LoopLocal(self.max_concurrency)
        self._closed = False
        self._userns_pool: list[int] = (
            [_new_userns() for _ in range(self.max_concurrency)] if self._privileged else []
        )
        self._static_args = self._build_static_args(bwrap, prefixes)

    # -- public API -------------------------------------------------------------------------

    async def run(
        self, code: str, *, timeout_s: float | None = None, memory_mb: int | None = None
    ) -> ExecResult:
        """Execute ``code`` in a fresh container; see :meth:`agentrl.sandbox.Sandbox.run`."""
        if self._closed:
            raise SandboxError("BubblewrapSandbox.run called after aclose()")
        timeout, memory = _run_settings(timeout_s, memory_mb, self.timeout_s, self.memory_mb)
        limits = _Limits.for_run(
            timeout_s=timeout, memory_mb=memory, max_processes=self.max_processes
        )
        async with self._limiter.get():
            userns = self._take_userns()
            try:
                raw = await _run_process(
                    lambda marker_fd: self._argv(marker_fd, limits, userns),
                    code=code,
                    env={"PATH": "/usr/bin:/bin"},
                    timeout_s=timeout,
                    max_output_bytes=self.max_output_bytes,
                    pass_fds=() if userns is None else (userns,),
                )
            finally:
                if userns is not None:
                    self._userns_pool.append(userns)
        return _to_result(raw, what="bubblewrap sandbox")

    async def aclose(self) -> None:
        """Close the per-slot user namespaces (root only); ``run`` raises afterwards."""
        self._closed = True
        while self._userns_pool:
            os.close(self._userns_pool.pop())

    async def __aenter__(self) -> BubblewrapSandbox:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return (
            f"BubblewrapSandbox(python={self._python!r}, max_concurrency={self.max_concurrency}, "
            f"timeout_s={self.timeout_s}, memory_mb={self.memory_mb}, "
            f"max_processes={self.max_processes}, privileged={self._privileged})"
        )

    # -- internals ---------------------------------------------------------------------------

    def _take_userns(self) -> int | None:
        if not self._privileged:
            return None
        if not self._userns_pool:  # only when used from two event loops at once
            self._userns_pool.append(_new_userns())
        return self._userns_pool.pop()

    def _argv(self, marker_fd: int, limits: _Limits, userns: int | None) -> list[str]:
        if userns is None:
            uid = str(SANDBOX_UID)
            head = [self._bwrap, "--unshare-all", "--uid", uid, "--gid", uid]
            drop_to = -1
        else:
            head = [
                self._bwrap, "--userns", str(userns),
                "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
                "--unshare-cgroup-try",
                "--uid", "0", "--gid", "0",
                "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
            ]
            drop_to = SANDBOX_UID
        python = _python_argv(self._python, marker_fd, limits, drop_to)
        return [*head, *self._static_args, "--", *python]

    def _build_static_args(self, bwrap: str, prefixes: Sequence[str]) -> list[str]:
        args = ["--die-with-parent", "--new-session", "--hostname", "sandbox", "--clearenv"]
        for key, value in SANDBOX_ENV.items():
            args += ["--setenv", key, value]
        bound: list[str] = []
        for path in SYSTEM_PATHS:
            if os.path.islink(path):
                args += ["--symlink", os.readlink(path), path]
            elif os.path.exists(path):
                args += ["--ro-bind", path, path]
                bound.append(os.path.realpath(path))
        for prefix in prefixes:
            if any(_is_within(prefix, b) for b in bound):
                continue
            # Parents are created 0755 explicitly: bwrap would copy the host's modes (e.g. 0700
            # for /root), which uid 65534 could not traverse.
            parent = os.path.dirname(prefix)
            ancestors = []
            while parent not in ("/", ""):
                ancestors.append(parent)
                parent = os.path.dirname(parent)
            for directory in reversed(ancestors):
                args += ["--perms", "0755", "--dir", directory]
            args += ["--ro-bind", prefix, prefix]
            bound.append(prefix)
        args += ["--proc", "/proc", "--dev", "/dev"]
        if _bwrap_supports(bwrap, "--size"):
            args += ["--size", str(TMPFS_BYTES)]
        # World-writable (sticky) like a normal /tmp: under root, bwrap creates it as uid 0.
        args += ["--perms", "1777", "--tmpfs", "/tmp", "--chdir", "/tmp"]
        return args


def _is_within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _bwrap_supports(bwrap: str, option: str) -> bool:
    try:
        text = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return option in text


def _resolve_python(python: str | None) -> tuple[str, list[str]]:
    """The interpreter's real path and the installation prefixes to bind for it."""
    if python is None:
        exe = _base_python()
        prefixes = {sys.base_prefix, sys.base_exec_prefix}
    else:
        found = shutil.which(python)
        if found is None:
            raise SandboxError(f"bubblewrap sandbox: python interpreter {python!r} not found")
        exe = os.path.realpath(found)
        try:
            out = subprocess.run(
                [exe, "-I", "-S", "-c", _PRINT_PREFIXES],
                capture_output=True, text=True, timeout=30, check=True, env={},
            ).stdout.split("\n")
        except (OSError, subprocess.SubprocessError) as exc:
            raise SandboxError(f"bubblewrap sandbox: cannot run python {exe!r}: {exc}") from exc
        prefixes = {out[0], out[1]}
    paths = {os.path.realpath(p) for p in prefixes if p}
    if not any(_is_within(exe, p) for p in paths) and not _is_within(exe, "/usr"):
        paths.add(os.path.dirname(exe))
    return exe, sorted(paths)


def _new_userns() -> int:
    """Create a user namespace mapping uids/gids 0 and 65534 to themselves; return an fd to it.

    Root only. The namespace lives as long as the returned descriptor is open.
    """
    try:
        helper = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _UNSHARE_HELPER],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env={},
        )
    except OSError as exc:
        raise SandboxError(f"bubblewrap sandbox: cannot start helper: {exc}") from exc
    assert helper.stdin is not None and helper.stdout is not None
    try:
        answer = helper.stdout.read(1)
        if answer != b"1":
            rest = helper.stdout.read1(200) if answer else b""
            raise SandboxUnavailable(
                "bubblewrap sandbox: running as root needs a user namespace of its own, but "
                "unshare(CLONE_NEWUSER) failed: "
                f"{(answer + rest).decode(errors='replace') or 'no answer'} (user namespaces may "
                "be disabled: check /proc/sys/user/max_user_namespaces, or run as a non-root user)"
            )
        mapping = f"0 0 1\n{SANDBOX_UID} {SANDBOX_UID} 1\n"
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{helper.pid}/{name}", "w") as f:
                f.write(mapping)
        return os.open(f"/proc/{helper.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise SandboxUnavailable(
            f"bubblewrap sandbox: cannot set up a user namespace: {exc}"
        ) from exc
    finally:
        helper.stdin.close()
        helper.wait()
        helper.stdout.close()
