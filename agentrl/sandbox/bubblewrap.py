"""A sandbox built on bubblewrap (``bwrap``): warm fork-server workers, or one container per run.

See :mod:`agentrl.sandbox` for the threat model. Both modes build the same container: an empty root
on a tmpfs holding, read-only, only what the interpreter needs (``/usr``, the ``/bin``, ``/lib``,
``/lib64`` links or directories, ``/etc/alternatives``, ``/etc/ld.so.cache``, the interpreter's
own prefix and the configured site-packages directories, bound at ``/opt/site/<i>``), plus a
private ``/proc``, a minimal ``/dev`` and a size-capped tmpfs ``/tmp`` as the working directory.
Every namespace is unshared (no network at all: only a loopback interface of its own), the
environment is cleared, and the code runs as uid/gid 65534 with no capabilities under rlimits.

**Warm mode** (``warm=True``, the default). Each worker is one long-lived ``bwrap`` container
running a fork server (:mod:`agentrl.sandbox._guest`, mode ``server``) that has imported the
configured modules (numpy and sympy by default) and run a warm-up. Per execution the server hands
out a *tree* it forked ahead of the request: ``I``, pid 1 of a fresh PID namespace with fresh mount
and IPC namespaces, a fresh tmpfs on ``/tmp`` and ``/dev/shm`` and its own ``/proc`` (created by a
small helper forked before the imports); and ``U``, a fork of the warm server inside those
namespaces, in a user namespace of its own as uid 65534 without capabilities, waiting for the
code. The engine sends the code and the write ends of two pipes straight to ``U``, reads the pipes
itself (capped), and at the deadline SIGKILLs ``I`` through a pidfd, which kills the whole PID
namespace. When the code ends, ``U`` kills whatever else is left in the namespace and reports.
If ``U`` exited by itself, the server keeps the tree once the engine has let go of it: ``I``
kills and reaps everything else, mounts empty tmpfs on ``/tmp`` and ``/dev/shm`` and moves to a
new IPC namespace, and a later execution's ``U`` is forked into it (no namespaces to create or
tear down: about 40 % of the CPU an execution cost without preloads). A timeout, a crash or a failed reset ends the
namespace instead. An execution therefore costs no interpreter start-up, import or fork on its
critical path (the fork and the teardown, ~7 ms of machine CPU without preloads and ~9-13 ms with
numpy and sympy, happen in the background). A worker runs one execution at a time (so concurrent executions never
share its network namespace); there are at most ``max_concurrency`` workers, launched on demand in
the background (executions that find no ready worker meanwhile run on the per-execution path) or
ahead with :meth:`BubblewrapSandbox.start`. A worker that dies or misbehaves is killed and
replaced; the execution it was running raises :class:`~agentrl.errors.SandboxError`.
``memory_mb`` is on top of the interpreter's own address space, as in every mode (here the warm
interpreter's: about 200 MB with numpy and sympy).

**Per-execution mode** (``warm=False``). Each execution is a fresh ``bwrap`` container running
``python -I -S`` with the guest runtime's one-shot prelude, which applies the limits
(:func:`agentrl.sandbox._guest.oneshot_prelude`; about 30 ms per execution, plus the imports the
code does).

**Sessions** (:meth:`BubblewrapSandbox.session`): a tree whose ``U`` keeps one ``__main__``
namespace across calls; it also gets a network namespace of its own. In warm mode it is forked by
a warm worker (milliseconds, modules already imported); in per-execution mode by a dedicated worker
without preloads, started for the session.

Running as root needs one extra step. ``bwrap --unshare-user`` maps the sandbox's uid to the
caller's uid, so under root the sandboxed process would still be host uid 0, for which the kernel
does not enforce ``RLIMIT_NPROC`` (a fork bomb would go unchecked) and which owns every root-owned
file that is bound in. So under root the sandbox pre-creates a user namespace mapping ``0 -> 0`` and
``65534 -> 65534`` (one per concurrency slot in per-execution mode, one per worker in warm mode);
``bwrap --userns`` enters it as uid 0 with only the capabilities the setup needs
(``CAP_SETUID``/``CAP_SETGID`` per execution; the warm server also ``CAP_SYS_ADMIN`` and
``CAP_NET_ADMIN``, over its own namespaces only), and the code then runs as uid/gid 65534 (host uid
65534, no capabilities left) before any of it runs. The process count is per execution: a user
namespace per slot in per-execution mode, a nested one per tree in warm mode (the kernel counts
processes per user namespace and uid). Capabilities left in the code's *inheritable* set are inert:
no permitted, effective or ambient capabilities, and ``no_new_privs``. (``bwrap --userns ... --uid
65534`` would be simpler, but bubblewrap 0.8 fails there: it calls ``setuid`` before ``setgid``.)
Not root: plain ``bwrap --unshare-all --uid 65534`` per execution, where the host uid is the
caller's and ``RLIMIT_NPROC`` applies normally; warm workers and sessions need root (see
:class:`BubblewrapSandbox`).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import anyio

from agentrl.errors import ConfigError, SandboxError, SandboxUnavailable
from agentrl.sandbox._backend import SandboxBase, TreeSession
from agentrl.sandbox._launch import NO_UID, guest_argv, oneshot_argv
from agentrl.sandbox._layout import (
    SANDBOX_ENV,
    SANDBOX_UID,
    SITE_MOUNT,
    SYSTEM_PATHS,
    TMPFS_BYTES,
    is_within,
    resolve_python,
    site_packages_binds,
)
from agentrl.sandbox._limits import Limits
from agentrl.sandbox._process import kill_group, run_process, to_result
from agentrl.sandbox._tree import AsyncConn, Tree, frame, request_header, run_on_tree
from agentrl.sandbox.base import ExecResult

__all__ = [
    "BubblewrapSandbox", "BubblewrapSession", "DEFAULT_PRELOAD", "DEFAULT_WARMUP", "PoolStats",
]

log = logging.getLogger(__name__)

#: Modules a warm worker imports when ``preload`` is not given (those that are installed).
DEFAULT_PRELOAD = ("numpy", "sympy")
#: Code a warm worker runs once after its imports when ``warmup`` is not given: it pulls in the
#: lazily imported parts of the preloaded modules (sympy's solvers, numpy's linalg).
DEFAULT_WARMUP = """\
import sys
if "sympy" in sys.modules:
    import sympy
    x = sympy.Symbol("x")
    sympy.solve(x**2 - 2, x)
    sympy.simplify(sympy.sin(x) ** 2 + sympy.cos(x) ** 2)
    sympy.Rational(1, 3) + sympy.sqrt(8)
    sympy.integrate(x**2, x)
if "numpy" in sys.modules:
    import numpy
    numpy.linalg.solve(numpy.eye(2), numpy.ones(2))
"""
#: How many one-shot trees a warm worker keeps forked ahead of requests.
PREFORK = 2
#: Capabilities the warm server keeps (inside its own user namespace only).
_SERVER_CAPS = (
    "CAP_SETUID", "CAP_SETGID", "CAP_SETFCAP", "CAP_SYS_ADMIN", "CAP_SYS_CHROOT", "CAP_NET_ADMIN",
)

_INSTALL_HINT = (
    "bubblewrap (`bwrap`) is not installed or not on PATH; install it with "
    "`apt-get install bubblewrap` (Debian/Ubuntu) or `dnf install bubblewrap` (Fedora), "
    "or choose another sandbox kind"
)

# Creates a user namespace and waits on stdin, so that the parent (root) can write its uid/gid maps
# and open /proc/<pid>/ns/user. 0x10000000 is CLONE_NEWUSER.
_UNSHARE_HELPER = (
    "import ctypes, os, sys\n"
    "ok = ctypes.CDLL(None, use_errno=True).unshare(0x10000000) == 0\n"
    "os.write(1, b'1' if ok else os.strerror(ctypes.get_errno()).encode())\n"
    "sys.stdin.read()\n"
)


@dataclass
class PoolStats:
    """Counters of a :class:`BubblewrapSandbox` since it was created.

    Attributes:
        warm_runs: one-shot executions served by a warm worker.
        cold_runs: one-shot executions that ran in a container of their own (per-execution mode,
            or warm mode while no worker was ready yet).
        workers_started: warm workers launched (including replacements and session-only ones).
        workers_replaced: warm workers killed because they died or misbehaved.
        trees_reused: warm executions that ran in a tree (PID, mount and IPC namespaces) an
            earlier execution had used and its init had reset (killed everything, fresh /tmp,
            /dev/shm and IPC namespace); the rest got a tree of their own.
    """

    warm_runs: int = 0
    cold_runs: int = 0
    workers_started: int = 0
    workers_replaced: int = 0
    trees_reused: int = 0


class BubblewrapSandbox(SandboxBase):
    """Runs code in bubblewrap containers as an unprivileged user (Linux only).

    Args:
        max_concurrency: most executions running at once (and, in warm mode, most workers);
            further ``run`` calls wait for a slot.
        timeout_s: default wall-clock deadline per execution, in seconds.
        memory_mb: default address space (RLIMIT_AS) each process may add to the interpreter's
            when it is handed the code, in MiB (a fresh one holds about 10 MB, a warm one about
            200 MB; see :meth:`agentrl.sandbox.Sandbox.run`).
        max_output_bytes: how much of stdout, and of stderr, is kept per execution (bytes).
        max_processes: most processes/threads the code may have at once (RLIMIT_NPROC, counted per
            execution), the interpreter's main thread included.
        python: interpreter to run inside (path or name on PATH); default: the base interpreter
            of the running Python (not its virtualenv's shim). Its installation prefix is bound
            read-only at the same path.
        warm: keep warm fork-server workers (default; needs root, see below) instead of starting
            one container and interpreter per execution.
        preload: modules each warm worker imports before forking executions. ``None``: those of
            :data:`DEFAULT_PRELOAD` that are installed; an explicit list must import (a worker
            that cannot import one fails to start with :class:`SandboxError`).
        warmup: Python code each warm worker runs once after the imports; ``None``:
            :data:`DEFAULT_WARMUP`; ``""``: none.
        site_packages: directories bound read-only at ``/opt/site/<i>`` and appended to the code's
            ``sys.path`` (both modes). ``None``: the running interpreter's site-packages when
            ``python`` is not given, else none. Everything in them is readable by the code.
        startup_timeout_s: longest wait for a warm worker to be ready (imports included).
        seccomp: run the code under the system-call filter of :mod:`agentrl.sandbox._seccomp`
            (True, the default; False only to measure what the filter costs).

    Raises:
        SandboxUnavailable: ``bwrap`` is not installed (the message says how to install it), or,
            under root, user namespaces cannot be created.
        SandboxError: the interpreter cannot be found or run.
        ConfigError: an argument is out of range.

    Warm workers and sessions need root (to give each execution user, PID and mount namespaces
    of its own inside the worker); as another user, ``warm=True`` falls back to per-execution
    containers with a warning, and :meth:`session` raises :class:`SandboxUnavailable`.

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
        warm: bool = True,
        preload: Sequence[str] | None = None,
        warmup: str | None = None,
        site_packages: Sequence[str] | None = None,
        startup_timeout_s: float = 120.0,
        seccomp: bool = True,
    ) -> None:
        self._init_settings(
            max_concurrency=max_concurrency, timeout_s=timeout_s, memory_mb=memory_mb,
            max_output_bytes=max_output_bytes, max_processes=max_processes,
        )
        if not startup_timeout_s > 0:
            raise ConfigError(f"sandbox: startup_timeout_s must be > 0, got {startup_timeout_s!r}")
        if isinstance(preload, str):
            raise ConfigError("sandbox: preload must be a list of module names, not a string")
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            raise SandboxUnavailable(_INSTALL_HINT)
        self.startup_timeout_s = float(startup_timeout_s)
        self._bwrap = bwrap
        self._python, prefixes = resolve_python(python)
        self._privileged = os.geteuid() == 0
        if warm and not self._privileged:
            log.warning(
                "BubblewrapSandbox: warm workers need root; running one bwrap container per "
                "execution instead (isolated, but each execution starts an interpreter)"
            )
        self.warm = bool(warm) and self._privileged
        self.site_packages, self._site_inside = site_packages_binds(site_packages, python)
        if preload is None:
            self.preload = [m for m in DEFAULT_PRELOAD if _importable(m, self.site_packages)]
            self._strict_preload = False
        else:
            self.preload = list(preload)
            self._strict_preload = True
        self.warmup = DEFAULT_WARMUP if warmup is None else warmup
        self._userns_pool: list[int] = (
            [_new_userns() for _ in range(self.max_concurrency)]
            if self._privileged and not self.warm else []
        )
        self._static_args = self._build_static_args(bwrap, prefixes)
        from agentrl.sandbox._seccomp import program

        self.seccomp = bool(seccomp)
        """Whether the user's code runs under the system-call filter (:mod:`agentrl.sandbox._seccomp`)."""
        self._seccomp_program = program() if self.seccomp else None
        self._idle: list[_Worker] = []
        self._launching: list[_Worker] = []
        self._workers: set[_Worker] = set()
        self._failure: SandboxError | None = None
        #: Counters (see :class:`PoolStats`).
        self.stats = PoolStats()

    # -- public API -------------------------------------------------------------------------

    async def run(
        self, code: str, *, timeout_s: float | None = None, memory_mb: int | None = None
    ) -> ExecResult:
        """Execute ``code`` in a fresh process; see :meth:`agentrl.sandbox.Sandbox.run`."""
        timeout, limits = self._run_limits("BubblewrapSandbox", timeout_s, memory_mb)
        async with self._limiter.get():
            if self.warm:
                return await self._run_warm(code, timeout, limits)
            return await self._run_cold(code, timeout, limits)

    async def start(self, workers: int | None = None) -> None:
        """Start warm workers and wait until they are ready (default: ``max_concurrency`` of
        them), so that executions do not run on the per-execution path while workers warm up.
        No-op in per-execution mode.

        Raises:
            SandboxError: a worker could not start (the message carries its error output).
        """
        if not self.warm:
            return
        if self._closed:
            raise SandboxError("BubblewrapSandbox.start called after aclose()")
        want = self.max_concurrency if workers is None else min(workers, self.max_concurrency)
        while len(self._workers) < want:
            self._launch()
        for worker in list(self._launching):
            try:
                await worker.wait_ready()
            except SandboxError:
                self._launching.remove(worker)
                self._discard(worker)
                raise
            self._launching.remove(worker)
            self._idle.append(worker)

    def session(self, *, memory_mb: int | None = None) -> BubblewrapSession:
        """A notebook-like session (see :class:`agentrl.sandbox.SandboxSession`); root only.

        Raises:
            SandboxUnavailable: not running as root (sessions need per-tree namespaces).
            ConfigError: ``memory_mb`` is not positive.
        """
        if not self._privileged:
            raise SandboxUnavailable(
                "bubblewrap sessions need root (user, PID and mount namespaces per session "
                "inside a worker); run the engine as root or use the 'docker' sandbox"
            )
        return BubblewrapSession(self, self._session_memory(memory_mb))

    async def aclose(self) -> None:
        """Stop every worker and session and close the namespaces; ``run`` raises afterwards."""
        await super().aclose()
        for worker in list(self._workers):
            self._discard(worker)
        self._idle.clear()
        self._launching.clear()
        while self._userns_pool:
            os.close(self._userns_pool.pop())

    def __repr__(self) -> str:
        return (
            f"BubblewrapSandbox(python={self._python!r}, warm={self.warm}, "
            f"preload={self.preload!r}, max_concurrency={self.max_concurrency}, "
            f"timeout_s={self.timeout_s}, memory_mb={self.memory_mb}, "
            f"max_processes={self.max_processes}, privileged={self._privileged})"
        )

    # -- per-execution mode ------------------------------------------------------------------

    async def _run_cold(self, code: str, timeout: float, limits: Limits) -> ExecResult:
        self.stats.cold_runs += 1
        userns = self._take_userns()
        seccomp_fd = None
        if self._seccomp_program is not None:  # bwrap reads the filter from a pipe and loads it before the exec
            seccomp_fd, w = os.pipe()
            os.write(w, self._seccomp_program)
            os.close(w)
        try:
            raw = await run_process(
                lambda marker_fd: self._argv(marker_fd, limits, userns, seccomp_fd),
                code=code,
                env={"PATH": "/usr/bin:/bin"},
                timeout_s=timeout,
                max_output_bytes=self.max_output_bytes,
                pass_fds=tuple(fd for fd in (userns, seccomp_fd) if fd is not None),
            )
        finally:
            if userns is not None:
                self._userns_pool.append(userns)
            if seccomp_fd is not None:
                os.close(seccomp_fd)
        return to_result(raw, what="bubblewrap sandbox")

    def _take_userns(self) -> int | None:
        if not self._privileged:
            return None
        if not self._userns_pool:  # only when used from two event loops at once
            self._userns_pool.append(_new_userns())
        return self._userns_pool.pop()

    def _argv(self, marker_fd: int, limits: Limits, userns: int | None, seccomp_fd: int | None = None) -> list[str]:
        """The one-shot command line: bwrap (``--seccomp seccomp_fd``: the filter, which bwrap
        installs right before it starts the interpreter), then :func:`oneshot_argv`."""
        if userns is None:
            uid = str(SANDBOX_UID)
            head = [self._bwrap, "--unshare-all", "--uid", uid, "--gid", uid]
            drop_to = NO_UID
        else:
            head = [
                self._bwrap, "--userns", str(userns),
                "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
                "--unshare-cgroup-try",
                "--uid", "0", "--gid", "0",
                "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
            ]
            drop_to = SANDBOX_UID
        if seccomp_fd is not None:
            head += ["--seccomp", str(seccomp_fd)]
        python = oneshot_argv(self._python, marker_fd, limits, drop_to, sys_path=self._site_inside)
        return [*head, *self._static_args, *self._site_args(), "--", *python]

    # -- warm mode ---------------------------------------------------------------------------

    async def _run_warm(self, code: str, timeout: float, limits: Limits) -> ExecResult:
        for attempt in range(2):
            worker = self._ready_worker()
            if worker is None:
                # No warm worker is ready yet (one is starting in the background): run this
                # execution in a container of its own rather than wait for the imports.
                return await self._run_cold(code, timeout, limits)
            try:
                tree = await worker.take("exec")
            except SandboxError:
                self.stats.workers_replaced += 1
                self._discard(worker)  # it died since its last execution: replace it
                if attempt:
                    raise
                continue
            break
        assert worker is not None
        self.stats.warm_runs += 1
        ok = False
        try:
            outcome = await run_on_tree(
                tree, code, request_header(limits, timeout), timeout_s=timeout,
                max_output_bytes=self.max_output_bytes, session=False,
            )
            ok = outcome.error is None
        except anyio.get_cancelled_exc_class():
            ok = True  # the tree is killed; the worker itself is fine
            raise
        finally:
            tree.close()
            self._release(worker, ok)
        if outcome.error is not None:
            raise SandboxError(f"bubblewrap sandbox (warm worker): {outcome.error}")
        return to_result(outcome.raw, what="bubblewrap sandbox (warm worker)")

    def _ready_worker(self) -> _Worker | None:
        """An idle, ready worker, or ``None`` (then one more is launched if there is room).

        Raises:
            SandboxError: the last worker launched failed to start (raised once; the next call
                launches again).
        """
        for worker in list(self._launching):
            try:
                ready = worker.poll_ready()
            except SandboxError as exc:
                self._launching.remove(worker)
                self._discard(worker)
                self._failure = exc
                continue
            if ready:
                self._launching.remove(worker)
                self._idle.append(worker)
        while self._idle:
            worker = self._idle.pop()
            if worker.alive():
                return worker
            self.stats.workers_replaced += 1
            self._discard(worker)
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure
        if len(self._workers) < self.max_concurrency:
            self._launch()
        return None

    async def _wait_worker(self) -> _Worker:
        """An idle, ready worker, waiting for one to start if need be (sessions)."""
        worker = self._ready_worker()
        if worker is not None:
            return worker
        if not self._launching:
            self._launch()
        candidate = self._launching[0]
        try:
            await candidate.wait_ready()
        except SandboxError:
            if candidate in self._launching:
                self._launching.remove(candidate)
            self._discard(candidate)
            raise
        if candidate in self._launching:
            self._launching.remove(candidate)
        return candidate

    def _launch(self, *, preload: bool = True) -> _Worker:
        worker = _Worker(self, preload=preload)
        self._workers.add(worker)
        self.stats.workers_started += 1
        try:
            worker.launch()
        except BaseException:
            self._discard(worker)
            raise
        if preload:
            self._launching.append(worker)
        return worker

    def _release(self, worker: _Worker, ok: bool) -> None:
        if ok and not self._closed and worker.alive():
            self._idle.append(worker)
        else:
            if not self._closed:
                self.stats.workers_replaced += 1
            self._discard(worker)

    def _discard(self, worker: _Worker) -> None:
        worker.kill()
        self._workers.discard(worker)
        if worker in self._idle:
            self._idle.remove(worker)

    def _server_argv(self, control_fd: int, userns: int, preload: bool) -> list[str]:
        caps: list[str] = []
        for cap in _SERVER_CAPS:
            caps += ["--cap-add", cap]
        head = [
            self._bwrap, "--userns", str(userns),
            "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
            "--unshare-cgroup-try", "--uid", "0", "--gid", "0", "--cap-drop", "ALL", *caps,
        ]
        config = {
            "control_fd": control_fd,
            "site": self._site_inside,
            "preload": self.preload if preload else [],
            "strict": self._strict_preload,
            "warmup": self.warmup if preload else "",
            "env": SANDBOX_ENV,
            "uid": SANDBOX_UID,
            "tmpfs_bytes": TMPFS_BYTES,
            "prefork": PREFORK if preload else 1,
            "seccomp": self._seccomp_program.hex() if self._seccomp_program else "",
        }
        python = guest_argv(self._python, "server", config)
        return [*head, *self._static_args, *self._site_args(), "--", *python]

    # -- shared ------------------------------------------------------------------------------

    def _site_args(self) -> list[str]:
        if not self.site_packages:
            return []
        args = ["--perms", "0755", "--dir", "/opt", "--perms", "0755", "--dir", SITE_MOUNT]
        for host, inside in zip(self.site_packages, self._site_inside, strict=True):
            args += ["--ro-bind", host, inside]
        return args

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
            if any(is_within(prefix, b) for b in bound):
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


class _Worker:
    """One warm ``bwrap`` container running the fork server (host side)."""

    def __init__(self, sandbox: BubblewrapSandbox, *, preload: bool) -> None:
        self.sandbox = sandbox
        self.preload = preload
        self.proc: subprocess.Popen[bytes] | None = None
        self.ctl: socket.socket | None = None
        self.stderr: Any = None
        self.loaded: list[str] = []
        self.dead = False
        self.ready = False
        self.launched_at = 0.0

    def launch(self) -> None:
        """Start the container (the server imports its modules on its own; see :meth:`poll_ready`).

        Raises:
            SandboxError: bwrap could not be started.
        """
        sb = self.sandbox
        host_end, guest_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            userns = _new_userns()
        except BaseException:
            host_end.close()
            guest_end.close()
            raise
        self.stderr = tempfile.TemporaryFile()
        try:
            argv = sb._server_argv(guest_end.fileno(), userns, self.preload)
            try:
                # From the event loop's thread: bwrap's --die-with-parent follows this thread.
                self.proc = subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.stderr,
                    env={"PATH": "/usr/bin:/bin"}, pass_fds=(guest_end.fileno(), userns),
                    start_new_session=True,
                )
            except OSError as exc:
                host_end.close()
                raise SandboxError(f"bubblewrap sandbox: cannot start {argv[0]!r}: {exc}") from exc
        finally:
            guest_end.close()
            os.close(userns)
        host_end.setblocking(False)
        self.ctl = host_end
        self.launched_at = time.monotonic()

    def poll_ready(self) -> bool:
        """Whether the server has said it is ready (non-blocking).

        Raises:
            SandboxError: it failed to start, or did not within ``startup_timeout_s``.
        """
        if self.ready:
            return True
        if self.ctl is None or self.dead:
            raise SandboxError("bubblewrap sandbox: a warm worker failed to start")
        try:
            data = self.ctl.recv(1 << 16)
        except BlockingIOError:
            if time.monotonic() - self.launched_at > self.sandbox.startup_timeout_s:
                self._fail(
                    f"a warm worker did not start within {self.sandbox.startup_timeout_s:g} s"
                )
            return False
        except OSError:
            data = b""
        msg: dict[str, Any] | None = None
        if data:
            try:
                msg = json.loads(data[4:])
            except ValueError:
                msg = None
        if not isinstance(msg, dict) or msg.get("event") != "ready":
            detail = msg.get("message") if isinstance(msg, dict) else None
            self._fail(f"a warm worker failed to start: {detail or 'it exited'}")
        assert msg is not None
        self.loaded = list(msg.get("loaded", []))
        self.ready = True
        return True

    async def wait_ready(self) -> None:
        """Wait until :meth:`poll_ready` says ready (or raises)."""
        while not self.poll_ready():
            assert self.ctl is not None
            with anyio.move_on_after(0.5):
                await anyio.wait_readable(self.ctl)

    def _fail(self, what: str) -> None:
        if self.proc is not None:
            try:
                self.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass
        note = self._stderr_note()
        self.kill()
        raise SandboxError(f"bubblewrap sandbox: {what}{note}")

    async def take(self, kind: str) -> Tree:
        """A fresh tree (``"exec"``: forked ahead; ``"session"``: forked now) from the server.

        Raises:
            SandboxError: the worker is dead or answered nonsense.
        """
        if self.ctl is None or self.dead:
            raise SandboxError("bubblewrap sandbox: the warm worker is gone")
        try:
            self.ctl.send(frame({"op": "take", "kind": kind}))
        except OSError as exc:
            raise SandboxError(f"bubblewrap sandbox: the warm worker is gone: {exc}") from exc
        with anyio.move_on_after(30) as scope:
            msg, fds = await self._recv()
        if scope.cancelled_caught or msg is None or msg.get("event") != "tree" or len(fds) != 2:
            for fd in fds if not scope.cancelled_caught and msg is not None else ():
                os.close(fd)
            raise SandboxError(
                f"bubblewrap sandbox: the warm worker did not hand out a tree{self._stderr_note()}"
            )
        sock = socket.socket(fileno=fds[0])
        if kind == "exec" and msg.get("reused"):
            self.sandbox.stats.trees_reused += 1
        return Tree(AsyncConn(sock), pidfd=fds[1], reusable=kind == "exec")

    async def _recv(self) -> tuple[dict[str, Any] | None, list[int]]:
        assert self.ctl is not None
        while True:
            try:
                data, fds, _flags, _addr = socket.recv_fds(self.ctl, 1 << 16, 4)
            except BlockingIOError:
                await anyio.wait_readable(self.ctl)
                continue
            except OSError:
                return None, []
            if not data:
                return None, fds
            try:
                return json.loads(data[4:]), fds
            except ValueError:
                for fd in fds:
                    os.close(fd)
                return {"event": "garbage"}, []

    def alive(self) -> bool:
        return not self.dead and self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """Kill the container (and with it every tree it forked); idempotent."""
        self.dead = True
        if self.proc is not None and self.proc.returncode is None:
            kill_group(self.proc.pid)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                log.warning("bubblewrap sandbox: worker %d did not exit after SIGKILL", self.proc.pid)
        if self.ctl is not None:
            self.ctl.close()
            self.ctl = None
        if self.stderr is not None:
            self.stderr.close()
            self.stderr = None

    def _stderr_note(self) -> str:
        if self.stderr is None:
            return ""
        try:
            self.stderr.seek(0)
            text = self.stderr.read()[-4000:].decode("utf-8", "replace").strip()
        except (OSError, ValueError):
            return ""
        return f": {text}" if text else ""


class BubblewrapSession(TreeSession):
    """A session of a :class:`BubblewrapSandbox` (see :class:`agentrl.sandbox.SandboxSession`).

    Attributes:
        restarts: how many times the interpreter was started afresh after losing its state.
    """

    _what = "bubblewrap session"

    def __init__(self, sandbox: BubblewrapSandbox, memory_mb: int) -> None:
        super().__init__(sandbox, memory_mb)
        self._own_worker: _Worker | None = None

    def _free(self) -> None:
        if self._own_worker is not None:
            self.sandbox._discard(self._own_worker)
            self._own_worker = None

    async def _new_tree(self) -> Tree:
        sb = self.sandbox
        if sb.warm:
            async with sb._limiter.get():
                for attempt in range(2):
                    worker = await sb._wait_worker()
                    try:
                        tree = await worker.take("session")
                    except SandboxError:
                        sb._discard(worker)
                        if attempt:
                            raise
                        continue
                    sb._release(worker, True)
                    return tree
            raise AssertionError("unreachable")
        # Per-execution mode: a dedicated worker without preloads serves this session only.
        if self._own_worker is None or not self._own_worker.alive():
            if self._own_worker is not None:
                sb._discard(self._own_worker)
            self._own_worker = sb._launch(preload=False)
            try:
                await self._own_worker.wait_ready()
            except BaseException:
                sb._discard(self._own_worker)
                self._own_worker = None
                raise
        return await self._own_worker.take("session")


def _importable(module: str, site_packages: Sequence[str]) -> bool:
    """Whether ``module`` is in the standard library or one of ``site_packages``."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return False
    origin = os.path.realpath(spec.origin)
    stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])
    return any(is_within(origin, p) for p in [*site_packages, stdlib])


def _bwrap_supports(bwrap: str, option: str) -> bool:
    try:
        text = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return option in text


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
            rest = os.read(helper.stdout.fileno(), 200) if answer else b""
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
