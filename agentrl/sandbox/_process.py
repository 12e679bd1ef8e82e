"""Supervising one sandboxed process, and reading what it did as an :class:`ExecResult`.

:func:`run_process` is the event-loop-agnostic supervisor (asyncio and trio, through anyio) of the
one-shot paths (bubblewrap's per-execution mode, unsafe-local ``run``): it starts the process in a
session of its own, feeds the code on stdin, reads both output streams concurrently with a cap
(:class:`Capture`), enforces the wall-clock deadline by killing the whole process group
(:func:`kill_group`), and reaps. The tree protocol (:mod:`agentrl.sandbox._tree`) and the Docker
backend reuse its pieces. :func:`to_result` turns what a supervisor observed (:class:`Raw`) into
the :class:`ExecResult`, or a :class:`~agentrl.errors.SandboxError` when the code never ran.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO

import anyio

from agentrl.errors import SandboxError
from agentrl.sandbox.base import ExecResult

#: After the process exits, how long to keep reading pipes still held open by stragglers.
DRAIN_GRACE_S = 0.5

_MEMORY_ERROR_RE = re.compile(rb"(?m)^MemoryError\b")


class Capture:
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
class Raw:
    """What the supervisor observed, before interpretation into an :class:`ExecResult`."""

    stdout: Capture
    stderr: Capture
    returncode: int  # Popen convention: negative = killed by that signal
    timed_out: bool  # we killed it at the deadline
    started: bool  # the guest runtime said setup finished: the user's code ran
    wall_s: float


async def drain(fd: int, capture: Capture) -> None:
    """Read the non-blocking descriptor ``fd`` into ``capture`` until end of file."""
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


def exited(pid: int) -> bool:
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
    while not exited(pid):  # kernels without pidfd_open (< 5.3): poll
        await anyio.sleep(0.005)


def kill_group(pid: int) -> None:
    """SIGKILL the process group led by ``pid`` and ``pid`` itself; ignore what is already gone."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


async def run_process(
    build_argv: Callable[[int], Sequence[str]],
    *,
    code: str,
    env: Mapping[str, str],
    timeout_s: float,
    max_output_bytes: int,
    cwd: str | None = None,
    pass_fds: Sequence[int] = (),
) -> Raw:
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
                kill_group(proc.pid)
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
) -> Raw:
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    out, err = Capture(max_output_bytes), Capture(max_output_bytes)
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
            tg.start_soon(drain, proc.stdout.fileno(), out)
            tg.start_soon(drain, proc.stderr.fileno(), err)
            with anyio.move_on_after(timeout_s) as scope:
                await _wait_exit(proc.pid, pidfd)
            timed_out = scope.cancelled_caught
            # Kill the group before reaping: stragglers die, and the pid cannot be reused meanwhile.
            kill_group(proc.pid)
            with anyio.CancelScope(shield=True):
                await _wait_exit(proc.pid, pidfd)
            returncode = proc.wait()
            wall_s = time.monotonic() - started_at
            # Readers stop at EOF; give pipes held open by escaped processes a short grace.
            tg.cancel_scope.deadline = anyio.current_time() + DRAIN_GRACE_S
    finally:
        if pidfd is not None:
            os.close(pidfd)
    os.set_blocking(marker_r, False)
    try:
        started = os.read(marker_r, 1) == b"1"
    except BlockingIOError:
        started = False
    return Raw(out, err, returncode, timed_out, started, wall_s)


def to_result(raw: Raw, *, what: str, state_lost: bool = False) -> ExecResult:
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
