"""The sandbox contract (:class:`ExecResult`, :class:`Sandbox`, :class:`SandboxSession`) and the
backends' shared runner.

A backend turns a string of Python source into an :class:`ExecResult`. Whatever the code does
(raise, loop forever, exhaust memory, print gigabytes) is an ordinary result; only a failure of the
backend itself (it cannot start, a worker died, or the interpreter never got to the user's code)
raises :class:`agentrl.errors.SandboxError`.

Two forms:

* one-shot: ``await sandbox.run(code)`` runs ``code`` in a fresh interpreter state; nothing of it
  survives the call.
* session (optional, :class:`SessionSandbox`): ``async with sandbox.session() as s:`` gives a
  notebook-like interpreter whose globals survive from one ``await s.run(...)`` to the next, for
  the length of one episode; leaving the block (or ``await s.aclose()``) destroys it. Every backend
  shipped with agentrl implements it.

The private helpers below are shared by :mod:`agentrl.sandbox.bubblewrap` and
:mod:`agentrl.sandbox.local`: a prelude that runs inside the child interpreter before the user's
code (drops privileges where asked, applies rlimits, proves that setup finished, then runs the
code), and an event-loop-agnostic supervisor (asyncio and trio, through anyio) that feeds the code
on stdin, reads both output streams concurrently with a cap, enforces the wall-clock deadline by
killing the whole process group, and reaps.
"""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Protocol, runtime_checkable

import anyio
import sniffio

from agentrl.errors import ConfigError, SandboxError

__all__ = ["ExecResult", "Sandbox", "SandboxSession", "SessionSandbox", "supports_sessions"]


@dataclass(frozen=True)
class ExecResult:
    """What one execution of model-written code produced.

    Attributes:
        stdout: everything the code wrote to standard output, decoded as UTF-8 (undecodable bytes
            become U+FFFD), cut to the sandbox's ``max_output_bytes`` (bytes, before decoding).
        stderr: the same for standard error; an uncaught exception's traceback ends up here, with
            the code's file shown as ``main.py``.
        exit_code: the interpreter's exit status: 0 on success, 1 for an uncaught exception, the
            value given to ``sys.exit``, or ``128 + N`` when the process died of signal ``N``
            (137 for SIGKILL). ``None`` when the code was killed at the deadline (wall clock, or
            its CPU-seconds limit), i.e. exactly when ``timed_out`` is true.
        timed_out: the code ran past its wall-clock deadline (or CPU-time limit) and the whole
            process tree was killed; output written before that is kept.
        memory_exceeded: the code ran out of memory: ``MemoryError`` appears at the start of a line
            of stderr (the address-space limit was hit), or the process was killed by SIGKILL
            that the sandbox did not send (e.g. the kernel's OOM killer).
        wall_s: wall-clock seconds from starting the process to its exit (sandbox setup included).
        stdout_truncated: stdout was longer than ``max_output_bytes`` and was cut (the rest was
            read and discarded, so the code never blocked on a full pipe).
        stderr_truncated: the same for stderr.
        state_lost: sessions only: this execution ended the session's interpreter (it ran past its
            deadline, died of a signal, or called ``os._exit``), so every variable defined so far
            is gone and the next ``run`` of the session starts from a fresh interpreter. Always
            false for one-shot runs (which keep no state).
    """

    stdout: str
    stderr: str
    exit_code: int | None
    timed_out: bool
    memory_exceeded: bool
    wall_s: float
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    state_lost: bool = False

    @property
    def ok(self) -> bool:
        """True when the code exited with status 0 and was not killed at the deadline."""
        return self.exit_code == 0 and not self.timed_out


@runtime_checkable
class Sandbox(Protocol):
    """Runs untrusted Python source and reports what happened.

    Implementations bound their own concurrency (extra calls wait for a slot) and can be used from
    asyncio or trio (through anyio).

    Optional: ``session(*, memory_mb=None) -> SandboxSession``, a notebook-like interpreter that
    keeps its state across calls (see :class:`SessionSandbox`). Callers test for it with
    :func:`supports_sessions`; test doubles need not implement it.
    """

    async def run(
        self, code: str, *, timeout_s: float | None = None, memory_mb: int | None = None
    ) -> ExecResult:
        """Execute ``code`` as the ``__main__`` module of a fresh interpreter.

        Args:
            code: Python source text; it is run as a script named ``main.py`` with an empty stdin.
            timeout_s: wall-clock deadline in seconds for this execution (``None``: the sandbox's
                default). Past it the whole process tree is killed and ``timed_out`` is set.
            memory_mb: address-space limit in MiB for each process of this execution (``None``:
                the sandbox's default).

        Returns:
            The :class:`ExecResult`; code that fails, hangs or exhausts memory is a result, not an
            exception.

        Raises:
            agentrl.errors.SandboxError: the sandbox itself failed (could not start, or the
                interpreter died before reaching the code). Not raised for anything the code does.
        """
        ...

    async def aclose(self) -> None:
        """Release the sandbox's resources; ``run`` must not be called afterwards."""
        ...


@runtime_checkable
class SandboxSession(Protocol):
    """One interpreter whose state (globals, imports, files in its private ``/tmp``) survives from
    one :meth:`run` to the next, like the cells of a notebook; for the length of one episode.

    Use it as an async context manager (``async with sandbox.session() as s``): entering starts
    the interpreter (raising :class:`~agentrl.errors.SandboxError` if it cannot), leaving destroys
    it and everything it started. Every cell runs under the same isolation and limits as a one-shot
    run; processes a cell started are killed when the cell ends. A cell that runs past its deadline
    or kills the interpreter ends the session's state (``ExecResult.state_lost``); the next cell
    starts over in a fresh interpreter. Different sessions never see each other's state.
    """

    async def run(
        self, code: str, *, timeout_s: float | None = None, memory_mb: int | None = None
    ) -> ExecResult:
        """Run one cell in the session's interpreter.

        Args:
            code: Python source; it runs in the session's persistent ``__main__`` namespace, as a
                file named ``cell<N>.py`` (N counts the cells from 1) in tracebacks.
            timeout_s: wall-clock deadline of this cell in seconds (``None``: the sandbox default).
                Past it the whole session is killed and ``state_lost`` is set.
            memory_mb: address-space limit of this cell in MiB (``None``: the session's). It can
                only be lower than the session's own limit, which is fixed when the session starts.

        Returns:
            The cell's :class:`ExecResult`; ``exit_code`` is 0, 1 for an uncaught exception, or the
            value given to ``sys.exit`` (which does not end the session).

        Raises:
            agentrl.errors.SandboxError: the sandbox failed (a worker died, the session could not be
                restarted, or the session was closed). Not raised for anything the code does.
        """
        ...

    async def aclose(self) -> None:
        """Destroy the interpreter and everything it started; ``run`` raises afterwards."""
        ...

    async def __aenter__(self) -> SandboxSession: ...

    async def __aexit__(self, *exc_info: object) -> None: ...


@runtime_checkable
class SessionSandbox(Sandbox, Protocol):
    """A :class:`Sandbox` that also offers sessions (every backend shipped with agentrl)."""

    def session(self, *, memory_mb: int | None = None) -> SandboxSession:
        """A new, not yet started, session; start it with ``async with``.

        Args:
            memory_mb: the session's address-space limit in MiB (``None``: the sandbox default),
                for the whole session's interpreter on top of what it starts with.
        """
        ...


def supports_sessions(sandbox: object) -> bool:
    """Whether ``sandbox`` offers :meth:`SessionSandbox.session`."""
    return callable(getattr(sandbox, "session", None))


# --------------------------------------------------------------------------------------------
# Shared implementation (private to agentrl.sandbox)
# --------------------------------------------------------------------------------------------

#: Largest file a sandboxed process may write (RLIMIT_FSIZE), in bytes.
_FSIZE_BYTES = 64 * 1024 * 1024
#: Most file descriptors a sandboxed process may hold open (RLIMIT_NOFILE).
_NOFILE = 256
#: After the process exits, how long to keep reading pipes still held open by stragglers.
_DRAIN_GRACE_S = 0.5
#: The file name the user's code runs under (tracebacks show it).
_CODE_FILENAME = "main.py"
#: Uid/gid meaning "do not change identity" in the prelude's arguments.
_NO_UID = -1

_MEMORY_ERROR_RE = re.compile(rb"(?m)^MemoryError\b")

# Runs as ``python -I -S -c _PRELUDE <marker_fd> <uid> <cpu_s> <as_bytes> <fsize> <nofile> <nproc>
# [<extra sys.path entries, colon-separated>]`` (a uid of -1: keep the identity).
# Order matters: drop privileges, apply limits, *then* write the marker byte (proof that setup
# finished and the user's code is about to run, so anything after it is the code's doing), close
# every inherited descriptor, read the code from stdin, save a copy as ./main.py (for source lines
# in tracebacks) and run it as __main__ with tracebacks that do not show the prelude.
_PRELUDE = r"""
def _agentrl_prelude():
    import os, resource, sys
    fd, uid, cpu, mem, fsize, nofile, nproc = (int(a) for a in sys.argv[1:8])
    if uid >= 0:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        if (os.getuid(), os.geteuid(), os.getgid(), os.getegid()) != (uid, uid, uid, uid):
            raise SystemExit("agentrl sandbox prelude: could not drop privileges")
    R = resource
    for res, soft, hard in (
        (R.RLIMIT_CORE, 0, 0),
        (R.RLIMIT_CPU, cpu, cpu + 1),
        (R.RLIMIT_AS, mem, mem),
        (R.RLIMIT_FSIZE, fsize, fsize),
        (R.RLIMIT_NOFILE, nofile, nofile),
        (R.RLIMIT_NPROC, nproc, nproc),
    ):
        resource.setrlimit(res, (soft, hard))
    if len(sys.argv) > 8 and sys.argv[8]:
        sys.path.extend(sys.argv[8].split(":"))
    os.write(fd, b"1")
    for name in os.listdir("/proc/self/fd"):
        if int(name) > 2:
            try:
                os.close(int(name))
            except OSError:
                pass
    text = sys.stdin.buffer.read().decode("utf-8", "surrogatepass")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    filename = "__FILENAME__"
    try:  # a copy on disk, so that tracebacks and inspect can show source lines
        with open(filename, "w", encoding="utf-8", errors="surrogatepass") as f:
            f.write(text)
    except (OSError, ValueError):
        pass
    def excepthook(t, v, tb, _hook=sys.excepthook):
        while tb is not None and tb.tb_frame.f_code.co_filename == "<string>":
            tb = tb.tb_next
        if isinstance(v, BaseException):
            v.__traceback__ = tb
        _hook(t, v, tb)
    sys.excepthook = excepthook
    import builtins
    def exit(code=None):
        raise SystemExit(code)
    builtins.exit = builtins.quit = exit
    sys.argv = [filename]
    sys.stdout.reconfigure(line_buffering=True)
    g = sys.modules["__main__"].__dict__
    del g["_agentrl_prelude"]
    g["__file__"] = filename
    return compile(text, filename, "exec", dont_inherit=True)
exec(_agentrl_prelude())
""".replace("__FILENAME__", _CODE_FILENAME)


@dataclass(frozen=True)
class _Limits:
    """Resource limits applied by the prelude to the sandboxed interpreter (and inherited)."""

    cpu_s: int
    memory_bytes: int
    fsize_bytes: int
    nofile: int
    nproc: int

    @classmethod
    def for_run(cls, *, timeout_s: float, memory_mb: int, max_processes: int) -> _Limits:
        """CPU seconds a bit above the wall deadline (the deadline normally fires first)."""
        return cls(
            cpu_s=math.ceil(timeout_s) + 1,
            memory_bytes=memory_mb * 1024 * 1024,
            fsize_bytes=_FSIZE_BYTES,
            nofile=_NOFILE,
            nproc=max_processes,
        )


def _python_argv(
    python: str, marker_fd: int, limits: _Limits, uid: int = _NO_UID, sys_path: Sequence[str] = ()
) -> list[str]:
    """The interpreter command line that runs the prelude.

    ``-I``: isolated mode (no ``PYTHON*`` variables, no user site, no script directory on the path);
    ``-S``: no ``site`` import, so no site-packages (the standard library only) and a fast start
    (the prelude supplies the ``exit``/``quit`` builtins that ``site`` would have added).
    """
    return [
        python,
        "-I",
        "-S",
        "-c",
        _PRELUDE,
        str(marker_fd),
        str(uid),
        str(limits.cpu_s),
        str(limits.memory_bytes),
        str(limits.fsize_bytes),
        str(limits.nofile),
        str(limits.nproc),
        *([":".join(sys_path)] if sys_path else []),
    ]


def _check_settings(
    *, max_concurrency: int, timeout_s: float, memory_mb: int, max_output_bytes: int,
    max_processes: int,
) -> None:
    """Reject nonsensical constructor arguments with a :class:`ConfigError` naming the argument."""
    for name, value in (
        ("max_concurrency", max_concurrency),
        ("timeout_s", timeout_s),
        ("memory_mb", memory_mb),
        ("max_output_bytes", max_output_bytes),
        ("max_processes", max_processes),
    ):
        if not value > 0:
            raise ConfigError(f"sandbox: {name} must be > 0, got {value!r}")


def _run_settings(
    timeout_s: float | None, memory_mb: int | None, default_timeout_s: float, default_memory_mb: int
) -> tuple[float, int]:
    """Resolve per-run overrides against the sandbox defaults, validating them."""
    t = default_timeout_s if timeout_s is None else timeout_s
    m = default_memory_mb if memory_mb is None else memory_mb
    if not t > 0:
        raise ConfigError(f"sandbox run: timeout_s must be > 0, got {t!r}")
    if not m > 0:
        raise ConfigError(f"sandbox run: memory_mb must be > 0, got {m!r}")
    return t, m


def _base_python() -> str:
    """The real path of the base interpreter behind the running one (not a venv's shim)."""
    exe = getattr(sys, "_base_executable", None) or sys.executable
    real = os.path.realpath(exe)
    if os.path.isfile(real) and os.access(real, os.X_OK):
        return real
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    candidate = os.path.join(sys.base_prefix, "bin", f"python{version}")
    if os.access(candidate, os.X_OK):
        return os.path.realpath(candidate)
    raise SandboxError(f"cannot find the base Python interpreter (tried {exe!r} and {candidate!r})")


class _LoopLocal:
    """A :class:`anyio.CapacityLimiter` per event loop (anyio primitives are bound to one loop)."""

    def __init__(self, total_tokens: int) -> None:
        self._total = total_tokens
        self._key: object = None
        self._limiter: anyio.CapacityLimiter | None = None

    def get(self) -> anyio.CapacityLimiter:
        """The limiter for the running event loop (created on first use in that loop)."""
        key = _loop_key()
        if self._limiter is None or key is not self._key:
            self._key, self._limiter = key, anyio.CapacityLimiter(self._total)
        return self._limiter


def _loop_key() -> object:
    """An object identifying the running event loop (asyncio loop or trio run)."""
    if sniffio.current_async_library() == "trio":
        import trio

        return trio.lowlevel.current_trio_token()
    import asyncio

    return asyncio.get_running_loop()


class _Capture:
    """Keeps the first ``limit`` bytes of a stream (and a short tail for classification)."""

    _TAIL = 4096

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.data = bytearray()
        self.tail = bytearray()
        self.truncated = False

    def feed(self, chunk: bytes) -> None:
        room = self.limit - len(self.data)
        if room > 0:
            self.data += chunk[:room]
        if len(chunk) > room:
            self.truncated = True
        self.tail += chunk
        if len(self.tail) > self._TAIL:
            del self.tail[: len(self.tail) - self._TAIL]


@dataclass(frozen=True)
class _Raw:
    """What the supervisor observed, before interpretation into an :class:`ExecResult`."""

    stdout: _Capture
    stderr: _Capture
    returncode: int  # Popen convention: negative = killed by that signal
    timed_out: bool  # we killed it at the deadline
    started: bool  # the prelude wrote its marker: setup finished, the user's code ran
    wall_s: float


async def _drain(fd: int, capture: _Capture) -> None:
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            await anyio.wait_readable(fd)
            continue
        except OSError:
            return
        if not chunk:
            return
        capture.feed(chunk)


async def _feed(stream: IO[bytes], data: bytes) -> None:
    """Write ``data`` to the child's stdin without blocking the loop, then close it (EOF)."""
    fd = stream.fileno()
    view = memoryview(data)
    try:
        while view:
            try:
                n = os.write(fd, view)
            except BlockingIOError:
                await anyio.wait_writable(fd)
                continue
            view = view[n:]
    except OSError:  # BrokenPipeError: the child exited (or never read); nothing more to do
        pass
    finally:
        try:
            stream.close()
        except OSError:
            pass


def _exited(pid: int) -> bool:
    """Whether ``pid`` (our child) has exited, without reaping it."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # already reaped (e.g. SIGCHLD ignored): it is gone
        return True
    return info is not None and info.si_pid != 0


async def _wait_exit(pid: int, pidfd: int | None) -> None:
    """Wait until child ``pid`` exits, leaving it unreaped (so its pid and group stay reserved)."""
    if pidfd is not None:
        await anyio.wait_readable(pidfd)
        return
    while not _exited(pid):  # kernels without pidfd_open (< 5.3): poll
        await anyio.sleep(0.005)


def _kill_group(pid: int) -> None:
    """SIGKILL the process group led by ``pid`` and ``pid`` itself; ignore what is already gone."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


async def _run_process(
    build_argv: Callable[[int], Sequence[str]],
    *,
    code: str,
    env: Mapping[str, str],
    timeout_s: float,
    max_output_bytes: int,
    cwd: str | None = None,
    pass_fds: Sequence[int] = (),
) -> _Raw:
    """Start ``build_argv(marker_fd)``, feed ``code`` on stdin, supervise it until exit or deadline.

    The process is started with :class:`subprocess.Popen` from the event loop's own thread (not a
    worker thread: a parent-death signal such as bwrap's ``--die-with-parent`` follows the
    *thread* that forked, and trio forks from short-lived worker threads), in a new session so the
    whole group can be killed. Pipes and the exit are awaited with :func:`anyio.wait_readable`, so
    this runs on asyncio and trio alike. The process group is always SIGKILLed before the leader
    is reaped, so nothing started by the code survives it (within that group).
    """
    data = code.encode("utf-8", "surrogatepass")
    marker_r, marker_w = os.pipe()
    try:
        argv = list(build_argv(marker_w))
        started_at = time.monotonic()
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=dict(env),
                cwd=cwd,
                pass_fds=(marker_w, *pass_fds),
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            raise SandboxError(f"sandbox: could not start {argv[0]!r}: {exc}") from exc
        finally:
            os.close(marker_w)
        try:
            return await _supervise(proc, data, timeout_s, max_output_bytes, started_at, marker_r)
        finally:
            if proc.returncode is None:  # cancelled from outside, or an unexpected error
                _kill_group(proc.pid)
                proc.wait()
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None:
                    try:
                        stream.close()
                    except OSError:
                        pass
    finally:
        os.close(marker_r)


async def _supervise(
    proc: subprocess.Popen[bytes],
    data: bytes,
    timeout_s: float,
    max_output_bytes: int,
    started_at: float,
    marker_r: int,
) -> _Raw:
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    out, err = _Capture(max_output_bytes), _Capture(max_output_bytes)
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        os.set_blocking(stream.fileno(), False)
    try:
        pidfd: int | None = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        pidfd = None
    timed_out = False
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_feed, proc.stdin, data)
            tg.start_soon(_drain, proc.stdout.fileno(), out)
            tg.start_soon(_drain, proc.stderr.fileno(), err)
            with anyio.move_on_after(timeout_s) as scope:
                await _wait_exit(proc.pid, pidfd)
            timed_out = scope.cancelled_caught
            # Kill the group before reaping: stragglers die, and the pid cannot be reused meanwhile.
            _kill_group(proc.pid)
            with anyio.CancelScope(shield=True):
                await _wait_exit(proc.pid, pidfd)
            returncode = proc.wait()
            wall_s = time.monotonic() - started_at
            # Readers stop at EOF; give pipes held open by escaped processes a short grace.
            tg.cancel_scope.deadline = anyio.current_time() + _DRAIN_GRACE_S
    finally:
        if pidfd is not None:
            os.close(pidfd)
    os.set_blocking(marker_r, False)
    try:
        started = os.read(marker_r, 1) == b"1"
    except BlockingIOError:
        started = False
    return _Raw(out, err, returncode, timed_out, started, wall_s)


def _to_result(raw: _Raw, *, what: str, state_lost: bool = False) -> ExecResult:
    """Interpret a supervised run, raising :class:`SandboxError` when the code never ran."""
    stderr_text = bytes(raw.stderr.data).decode("utf-8", "replace")
    if not raw.started:
        if raw.timed_out:
            raise SandboxError(f"{what}: the sandbox did not finish starting before the deadline")
        raise SandboxError(
            f"{what}: the sandbox failed before running the code (exit status "
            f"{raw.returncode}): {stderr_text.strip()[-2000:] or '<no output>'}"
        )
    rc = raw.returncode if raw.returncode >= 0 else 128 - raw.returncode
    timed_out = raw.timed_out or rc == 128 + signal.SIGXCPU
    killed_by_us = raw.timed_out
    memory = bool(_MEMORY_ERROR_RE.search(bytes(raw.stderr.tail))) or (
        not killed_by_us and rc == 128 + signal.SIGKILL
    )
    return ExecResult(
        stdout=bytes(raw.stdout.data).decode("utf-8", "replace"),
        stderr=stderr_text,
        exit_code=None if timed_out else rc,
        timed_out=timed_out,
        memory_exceeded=memory,
        wall_s=raw.wall_s,
        stdout_truncated=raw.stdout.truncated,
        stderr_truncated=raw.stderr.truncated,
        state_lost=state_lost,
    )
