"""A sandbox built on bubblewrap (``bwrap``): warm fork-server workers, or one container per run.

See :mod:`agentrl.sandbox` for the threat model. Both modes build the same container: an empty root
on a tmpfs holding, read-only, only what the interpreter needs (``/usr``, the ``/bin``, ``/lib``,
``/lib64`` links or directories, ``/etc/alternatives``, ``/etc/ld.so.cache``, the interpreter's
own prefix and the configured site-packages directories, bound at ``/opt/site/<i>``), plus a
private ``/proc``, a minimal ``/dev`` and a size-capped tmpfs ``/tmp`` as the working directory.
Every namespace is unshared (no network at all: only a loopback interface of its own), the
environment is cleared, and the code runs as uid/gid 65534 with no capabilities under rlimits.

**Warm mode** (``warm=True``, the default). Each worker is one long-lived ``bwrap`` container
running a fork server (:mod:`agentrl.sandbox.guest`, mode ``server``) that has imported the
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
replaced; the execution it was running raises :class:`~agentrl.errors.SandboxError` if its code had
started, and is otherwise tried again on a fresh worker (:meth:`BubblewrapSandbox._run_warm` says
where "started" is). Each ``U`` is a session of its own, so signals the code sends to "its process
group" reach no other tree.
``memory_mb`` is on top of the interpreter's own address space, as in every mode (here the warm
interpreter's: about 200 MB with numpy and sympy).

**Per-execution mode** (``warm=False``). Each execution is a fresh ``bwrap`` container running
``python -I -S`` with the guest runtime's one-shot prelude, which applies the limits
(:func:`agentrl.sandbox.guest.oneshot.oneshot_prelude`; about 30 ms per execution, plus the imports the
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

This module is the sandbox itself: its settings, the choice between the warm and the
per-execution path, and both paths' tries. Its parts live apart: the command lines of both modes in
:mod:`agentrl.sandbox._bwrap_command`, the cgroups of the trees in
:mod:`agentrl.sandbox._bwrap_cgroups`, the session in :mod:`agentrl.sandbox._bwrap_session`
(:class:`BubblewrapSession` is re-exported here), the warm workers in :mod:`agentrl.sandbox._warm`,
trees in :mod:`agentrl.sandbox._tree`, the guest runtime in :mod:`agentrl.sandbox.guest`; seccomp,
layout, limits and process supervision each in a module of its own.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass

import anyio

from agentrl.errors import ConfigError, SandboxError, SandboxUnavailable
from agentrl.sandbox._backend import SandboxBase
from agentrl.sandbox._bwrap_cgroups import TreeCgroups, with_oom
from agentrl.sandbox._bwrap_command import container_args, oneshot_command, server_command, site_args
from agentrl.sandbox._bwrap_session import BubblewrapSession
from agentrl.sandbox._cgroups import Cgroup, CgroupRoot, CgroupsUnavailable, open_root
from agentrl.sandbox._launch import guest_code
from agentrl.sandbox._layout import (
    SANDBOX_ENV,
    SANDBOX_UID,
    TMPFS_BYTES,
    base_python,
    is_within,
    resolve_python,
    site_packages_binds,
)
from agentrl.sandbox._limits import Limits
from agentrl.sandbox._process import Raw, run_process, to_result
from agentrl.sandbox._tree import request_header, run_on_tree
from agentrl.sandbox._warm import ImportRouter, WarmPool, WarmWorker, new_userns
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
#: Most tries of one execution while the sandbox fails before the code started (see
#: :meth:`BubblewrapSandbox._run_warm`, :meth:`BubblewrapSandbox._run_cold`).
START_ATTEMPTS = 3
#: How many one-shot trees a warm worker keeps forked ahead of requests.
PREFORK = 2

_INSTALL_HINT = (
    "bubblewrap (`bwrap`) is not installed or not on PATH; install it with "
    "`apt-get install bubblewrap` (Debian/Ubuntu) or `dnf install bubblewrap` (Fedora), "
    "or choose another sandbox kind"
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
        start_retries: tries of an execution that failed before its code started and were made
            again on a fresh worker, tree or container (the execution never saw them).
        trees_reused: warm executions that ran in a tree (PID, mount and IPC namespaces) an
            earlier execution had used and its init had reset (killed everything, fresh /tmp,
            /dev/shm and IPC namespace); the rest got a tree of their own.
    """

    warm_runs: int = 0
    cold_runs: int = 0
    workers_started: int = 0
    workers_replaced: int = 0
    start_retries: int = 0
    trees_reused: int = 0


class BubblewrapSandbox(SandboxBase):
    """Runs code in bubblewrap containers as an unprivileged user (Linux only).

    Args:
        max_concurrency: most executions running at once (and, in warm mode, most workers of
            each kind); further ``run`` calls wait for a slot.
        timeout_s: default wall-clock deadline per execution, in seconds.
        memory_mb: default address space (RLIMIT_AS) each process may add to the interpreter's
            when it is handed the code, in MiB (a fresh one holds about 10 MB, a warm one about
            200 MB; see :meth:`agentrl.sandbox.Sandbox.run`). With cgroups, also what the whole
            process tree of an execution may use together (plus what copy-on-write may copy of
            the warm interpreter it was forked from).
        max_output_bytes: how much of stdout, and of stderr, is kept per execution (bytes).
        max_processes: most processes/threads the code may have at once (RLIMIT_NPROC, counted per
            execution, and with cgroups ``pids.max``), the interpreter's main thread included.
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
        cgroups: bound each execution's whole process tree with a cgroup of its own
            (:mod:`agentrl.sandbox._cgroups`: memory without swap, processes, CPU). ``None``
            (default): where the host lets the engine create cgroups (root, a usable v1 or
            delegated v2 hierarchy), else rlimits only, with a log line saying why; ``True``:
            required (:class:`SandboxUnavailable` if impossible); ``False``: rlimits only.
        cpus: with cgroups, the CPU bandwidth of one execution's tree, in cores (1.0: one core's
            worth; ``None``: unbounded).
        lean_workers: in warm mode, also keep workers without preloads for code that names none
            of the preloaded modules (:mod:`agentrl.sandbox._warm`: a smaller process to fork per
            execution); False: every execution goes to a worker with the preloads.

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
        cgroups: bool | None = None,
        cpus: float | None = 1.0,
        lean_workers: bool = True,
    ) -> None:
        self._init_settings(
            max_concurrency=max_concurrency, timeout_s=timeout_s, memory_mb=memory_mb,
            max_output_bytes=max_output_bytes, max_processes=max_processes,
        )
        if not startup_timeout_s > 0:
            raise ConfigError(f"sandbox: startup_timeout_s must be > 0, got {startup_timeout_s!r}")
        if isinstance(preload, str):
            raise ConfigError("sandbox: preload must be a list of module names, not a string")
        if cpus is not None and not cpus > 0:
            raise ConfigError(f"sandbox: cpus must be > 0 or None, got {cpus!r}")
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            raise SandboxUnavailable(_INSTALL_HINT)
        self.startup_timeout_s = float(startup_timeout_s)
        self._bwrap = bwrap
        self._python, prefixes = resolve_python(python)
        #: The compiled guest for warm servers when they run this interpreter (marshal data is
        #: only valid for the version that wrote it); None: they compile its source.
        self._guest_code = guest_code() if self._python == base_python() else None
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
            [new_userns() for _ in range(self.max_concurrency)]
            if self._privileged and not self.warm else []
        )
        self._static_args = container_args(bwrap, prefixes)
        from agentrl.sandbox._seccomp import lock_program, program

        self.seccomp = bool(seccomp)
        """Whether the user's code runs under the system-call filter (:mod:`agentrl.sandbox._seccomp`)."""
        self._seccomp_program = program() if self.seccomp else None
        #: Warm servers' two stages (see :mod:`agentrl.sandbox._seccomp`), hex.
        self._seccomp_stages = (program(setup=True).hex(), lock_program().hex()) if self.seccomp else ("", "")
        self.cpus = None if cpus is None else float(cpus)
        root: CgroupRoot | None = None
        self.cgroup_mode = "off"
        """How executions are bounded as a whole: ``"cgroup v1"``/``"cgroup v2"``, or why not."""
        if cgroups is not False:
            if not self._privileged:
                reason = "cgroups need root"
                if cgroups:
                    raise SandboxUnavailable(f"bubblewrap sandbox: {reason}")
                self.cgroup_mode = f"off ({reason})"
            else:
                try:
                    root = open_root()
                    self.cgroup_mode = f"cgroup v{root.version}"
                except CgroupsUnavailable as exc:
                    if cgroups:
                        raise SandboxUnavailable(f"bubblewrap sandbox: {exc}") from None
                    self.cgroup_mode = f"off ({exc})"
                    log.info("BubblewrapSandbox: no cgroups, rlimits only: %s", exc)
        #: The cgroups of the trees (none without cgroups).
        self._tree_cgroups = TreeCgroups(root, self.cpus)
        #: Counters (see :class:`PoolStats`).
        self.stats = PoolStats()
        self._router = ImportRouter(self.preload) if (lean_workers and self.preload) else None
        self._pool = WarmPool(
            lambda kind: WarmWorker(
                kind, lambda fd, userns, code_fd: self._server_argv(fd, userns, kind, code_fd),
                self.startup_timeout_s, self.stats, code=self._guest_code,
            ),
            self.max_concurrency, self.stats, self._worker_ready, self._worker_gone,
        )

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
        await self._pool.start({"full": want, **({"lean": want} if self._router else {})})

    def reap_dead_workers(self) -> int:
        """Forget the idle warm workers whose process died since they last ran (killed from
        outside); returns how many. They count in ``stats.workers_replaced``; the next execution
        gets a fresh worker, as it would have. 0 in per-execution mode or after ``aclose``."""
        if not self.warm or self._closed:
            return 0
        return self._pool.reap()

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
        self._pool.close()
        while self._userns_pool:
            os.close(self._userns_pool.pop())
        self._tree_cgroups.close()

    @property
    def _cgroups(self) -> CgroupRoot | None:
        """The sandbox's own cgroup directory; None without cgroups or once closed."""
        return self._tree_cgroups.root

    def __repr__(self) -> str:
        return (
            f"BubblewrapSandbox(python={self._python!r}, warm={self.warm}, "
            f"preload={self.preload!r}, max_concurrency={self.max_concurrency}, "
            f"timeout_s={self.timeout_s}, memory_mb={self.memory_mb}, "
            f"max_processes={self.max_processes}, privileged={self._privileged}, "
            f"cgroups={self.cgroup_mode!r})"
        )

    # -- per-execution mode ------------------------------------------------------------------

    async def _run_cold(self, code: str, timeout: float, limits: Limits) -> ExecResult:
        """One execution in a container of its own, tried again in a fresh container (at most
        :data:`START_ATTEMPTS` tries in all) while it fails *before the code started*.

        "Started" is the one-shot prelude's marker byte (:func:`agentrl.sandbox.guest.oneshot.oneshot_prelude`):
        written once bwrap has built the container and the interpreter has applied the limits
        and dropped to the sandbox uid, immediately before the code is compiled and run. A
        container that exited without it (and not at its deadline) never ran any of the code.
        """
        self.stats.cold_runs += 1
        for attempt in range(START_ATTEMPTS):
            if attempt:
                self.stats.start_retries += 1
            group = self._tree_cgroups.for_container(limits)
            try:
                ooms = group.oom_kills() if group else 0
                raw = await self._run_cold_in(code, timeout, limits, group)
                if raw.started or raw.timed_out or attempt == START_ATTEMPTS - 1:
                    return with_oom(to_result(raw, what="bubblewrap sandbox"), group, ooms)
            finally:
                if group is not None:  # reused unless something of the execution is left in it
                    self._tree_cgroups.container_done(group, closed=self._closed)
        raise AssertionError("unreachable")

    async def _run_cold_in(self, code: str, timeout: float, limits: Limits, group: Cgroup | None) -> Raw:
        """One per-execution container in ``group``, as the supervisor observed it."""
        userns = self._take_userns()
        cg_fds = tuple(group.procs_fds()) if group is not None else ()
        seccomp_fd = None
        if self._seccomp_program is not None:  # bwrap reads the filter from a pipe and loads it before the exec
            seccomp_fd, w = os.pipe()
            os.write(w, self._seccomp_program)
            os.close(w)
        try:
            return await run_process(
                lambda marker_fd: self._argv(marker_fd, limits, userns, seccomp_fd, cg_fds),
                code=code,
                env={"PATH": "/usr/bin:/bin"},
                timeout_s=timeout,
                max_output_bytes=self.max_output_bytes,
                pass_fds=(*(fd for fd in (userns, seccomp_fd) if fd is not None), *cg_fds),
            )
        finally:
            if userns is not None:
                self._userns_pool.append(userns)
            if seccomp_fd is not None:
                os.close(seccomp_fd)

    def _take_userns(self) -> int | None:
        if not self._privileged:
            return None
        if not self._userns_pool:  # only when used from two event loops at once
            self._userns_pool.append(new_userns())
        return self._userns_pool.pop()

    def _argv(
        self, marker_fd: int, limits: Limits, userns: int | None, seccomp_fd: int | None = None,
        cgroup_fds: Sequence[int] = (),
    ) -> list[str]:
        """The one-shot command line (:func:`~agentrl.sandbox._bwrap_command.oneshot_command`)."""
        return oneshot_command(
            self._bwrap, self._python, marker_fd, limits, userns, seccomp_fd, cgroup_fds,
            mounts=self._mounts(), sys_path=self._site_inside,
        )

    # -- warm mode ---------------------------------------------------------------------------

    async def _run_warm(self, code: str, timeout: float, limits: Limits) -> ExecResult:
        """One execution on a warm worker, retried on a fresh tree of a fresh worker (at most
        :data:`START_ATTEMPTS` tries in all) while the sandbox fails *before the code started*.

        "Started" is the tree's ``started`` event: ``U`` sends it once it has received the
        request, joined the execution's cgroup, applied the limits and pointed its output at the
        host's pipes, immediately before it compiles and runs the code
        (:func:`agentrl.sandbox.guest.execution.run_one`). Until the host has read that event, nothing of
        the code can have run, so a failure is the sandbox's alone (a worker that died, a tree
        whose processes were killed since it was forked, a setup error) and trying again on a
        fresh worker cannot run the code twice. After it, a failure belongs to the execution
        (:class:`SandboxError` when the worker vanished without an exit status). A tree is handed
        the code only when its init and ``U`` are alive (:meth:`Tree.usable`); a worker whose
        tree failed before the code started, or that no longer answers a ping after a tree that
        ended without an exit status, is replaced (killed; the next execution gets another
        worker, or runs in a container of its own while the replacement starts).
        """
        kind = self._router.kind(code) if self._router is not None else "full"
        failure = "no attempt"
        for attempt in range(START_ATTEMPTS):
            if attempt:
                self.stats.start_retries += 1
            worker = self._pool.ready(kind)
            if worker is None:
                # No warm worker is ready yet (one is starting in the background): run this
                # execution in a container of its own rather than wait for the imports.
                return await self._run_cold(code, timeout, limits)
            try:
                tree = await worker.take("exec")
            except SandboxError as exc:
                self.stats.workers_replaced += 1
                self._pool.discard(worker)  # it died since its last execution: replace it
                failure = str(exc)
                continue
            if not tree.usable():  # its processes were killed since it was forked
                tree.close()
                self._pool.release(worker, False, self._closed)
                failure = "bubblewrap sandbox (warm worker): the tree handed out was already dead"
                continue
            self.stats.warm_runs += 1
            ok = answered = False
            try:
                group = self._tree_cgroups.for_worker(worker, limits)
                ooms = group.oom_kills() if group is not None else 0
                outcome = await run_on_tree(
                    tree, code, request_header(limits, timeout), timeout_s=timeout,
                    max_output_bytes=self.max_output_bytes, session=False,
                    extra_fds=group.procs_fds() if group is not None else (),
                )
                ok = outcome.error is None and (outcome.raw.started or outcome.raw.timed_out)
                if not ok and outcome.raw.started:
                    # The code ran and its tree ended without a word (e.g. the code broke its own
                    # channel); the tree is killed. Keep the worker if its server still answers.
                    ok = answered = await worker.ping()
            except anyio.get_cancelled_exc_class():
                ok = True  # the tree is killed; the worker itself is fine
                raise
            finally:
                tree.close()
                self._pool.release(worker, ok, self._closed)
            if not outcome.raw.started and not outcome.raw.timed_out:  # the code never ran
                failure = (
                    f"bubblewrap sandbox (warm worker): {outcome.error or 'the sandbox process died before running the code'}"
                )
                continue
            if outcome.error is not None and answered:
                raise SandboxError(
                    "bubblewrap sandbox (warm worker): the execution's tree ended without an exit "
                    "status while its worker is fine (the code may have broken its own channel)"
                )
            if outcome.error is not None:
                raise SandboxError(f"bubblewrap sandbox (warm worker): {outcome.error}")
            return with_oom(to_result(outcome.raw, what="bubblewrap sandbox (warm worker)"), group, ooms)
        raise SandboxError(f"{failure} (tried {START_ATTEMPTS} times, never got as far as running the code)")

    def _worker_ready(self, worker: WarmWorker) -> None:
        if worker.kind == "full" and self._router is not None:
            self._router.add(worker.modules)

    def _worker_gone(self, worker: WarmWorker) -> None:
        if worker.cgroup is not None:
            worker.cgroup.remove()
            worker.cgroup = None

    def _server_argv(self, control_fd: int, userns: int, kind: str, code_fd: int | None = None) -> list[str]:
        """A warm server's command line for a worker of ``kind``
        (:func:`~agentrl.sandbox._bwrap_command.server_command`), with its configuration."""
        preload = kind == "full"
        config = {
            "control_fd": control_fd,
            "site": self._site_inside,
            "preload": self.preload if preload else [],
            "strict": self._strict_preload,
            "warmup": self.warmup if preload else "",
            "env": SANDBOX_ENV,
            "uid": SANDBOX_UID,
            "tmpfs_bytes": TMPFS_BYTES,
            "prefork": 1 if kind == "session" else PREFORK,
            "seccomp": self._seccomp_stages[0],
            "seccomp_lock": self._seccomp_stages[1],
        }
        return server_command(self._bwrap, self._python, userns, config, self._mounts(), code_fd)

    # -- shared ------------------------------------------------------------------------------

    def _mounts(self) -> list[str]:
        """What both command lines bind: the container's arguments (computed once, in
        ``_static_args``), then the site-packages binds."""
        return [*self._static_args, *site_args(self.site_packages, self._site_inside)]


def _importable(module: str, site_packages: Sequence[str]) -> bool:
    """Whether ``module`` is in the standard library or one of ``site_packages``."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return False
    origin = os.path.realpath(spec.origin)
    stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])
    return any(is_within(origin, p) for p in [*site_packages, stdlib])

