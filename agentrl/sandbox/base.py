"""The sandbox contract: :class:`ExecResult`, :class:`Sandbox`, :class:`SandboxSession`,
:class:`SessionSandbox` and :func:`supports_sessions`.

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

Only the contract lives here; the backends' machinery is in private modules of the package
(``_process``: process supervision, ``_limits``: limits, ``_layout``: host layout, ``_launch`` and
the ``guest`` package: the in-sandbox runtime, ``_tree``: its protocol, ``_backend``: shared
backend code).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

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
            memory_mb: address space in MiB that each process of this execution may add to what
                the interpreter held when it was handed the code (``RLIMIT_AS``; ``None``: the
                sandbox's default). A fresh interpreter holds about 10 MB, a warm one that
                imported numpy and sympy about 200 MB.

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
            memory_mb: address space of this cell in MiB, on top of what the interpreter holds
                when the cell starts (``None``: the session's). The session's own limit, fixed
                when it starts, caps it.

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
