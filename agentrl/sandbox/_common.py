"""Pieces the sandbox backends (:mod:`~agentrl.sandbox.bubblewrap`, :mod:`~agentrl.sandbox.docker`,
:mod:`~agentrl.sandbox.local`) share: the common settings and context-manager plumbing of a
sandbox, and of a session, and the session whose interpreter is a :class:`~agentrl.sandbox._tree.Tree`.
"""

from __future__ import annotations

from typing import Any, TypeVar

from agentrl.errors import SandboxError
from agentrl.sandbox._tree import Tree, request_header, run_on_tree
from agentrl.sandbox.base import (
    ExecResult,
    _check_settings,
    _Limits,
    _LoopLocal,
    _run_settings,
    _to_result,
)

_S = TypeVar("_S")


class _SandboxBase:
    """Settings, concurrency limiter, session registry and ``async with`` of a sandbox."""

    def _init_settings(
        self,
        *,
        max_concurrency: int,
        timeout_s: float,
        memory_mb: int,
        max_output_bytes: int,
        max_processes: int,
    ) -> None:
        """Check (raises ConfigError) and store the settings every backend takes; set up the
        concurrency limiter and the session registry."""
        _check_settings(
            max_concurrency=max_concurrency, timeout_s=timeout_s, memory_mb=memory_mb,
            max_output_bytes=max_output_bytes, max_processes=max_processes,
        )
        self.timeout_s = float(timeout_s)
        self.memory_mb = int(memory_mb)
        self.max_output_bytes = int(max_output_bytes)
        self.max_processes = int(max_processes)
        self.max_concurrency = int(max_concurrency)
        self._limiter = _LoopLocal(self.max_concurrency)
        self._closed = False
        self._sessions: set[Any] = set()

    def _run_limits(
        self, name: str, timeout_s: float | None, memory_mb: int | None
    ) -> tuple[float, _Limits]:
        """The deadline and limits of one ``run`` call (raises SandboxError once closed)."""
        if self._closed:
            raise SandboxError(f"{name}.run called after aclose()")
        timeout, memory = _run_settings(timeout_s, memory_mb, self.timeout_s, self.memory_mb)
        return timeout, _Limits.for_run(
            timeout_s=timeout, memory_mb=memory, max_processes=self.max_processes
        )

    def _session_memory(self, memory_mb: int | None) -> int:
        _, memory = _run_settings(None, memory_mb, self.timeout_s, self.memory_mb)
        return memory

    async def aclose(self) -> None:
        """Mark the sandbox closed and end its sessions."""
        self._closed = True
        for sess in list(self._sessions):
            await sess.aclose()

    async def __aenter__(self: _S) -> _S:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class _SessionBase:
    """The state and ``async with`` every backend's session shares.

    Attributes:
        restarts: how many times the interpreter was started afresh after losing its state.
    """

    #: How the session names itself in error messages (e.g. ``"docker session"``).
    _what = "session"

    def __init__(self, sandbox: Any, memory_mb: int) -> None:
        self.sandbox = sandbox
        self.memory_mb = memory_mb
        self.restarts = 0
        self._closed = False

    async def __aenter__(self: _S) -> _S:
        await self.start()  # type: ignore[attr-defined]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()  # type: ignore[attr-defined]

    def _check_startable(self) -> None:
        if self._closed or self.sandbox._closed:
            raise SandboxError(f"{self._what}: the session or its sandbox is closed")

    def _cell_limits(self, timeout_s: float | None, memory_mb: int | None) -> tuple[float, _Limits]:
        """The deadline and limits of one cell (raises SandboxError once closed)."""
        sb = self.sandbox
        if self._closed or sb._closed:
            raise SandboxError(f"{self._what}: run called after aclose()")
        timeout, memory = _run_settings(timeout_s, memory_mb, sb.timeout_s, self.memory_mb)
        return timeout, _Limits.for_run(
            timeout_s=timeout, memory_mb=min(memory, self.memory_mb), max_processes=sb.max_processes
        )


def _header(limits: _Limits, timeout: float, session_memory_bytes: int | None = None) -> dict[str, Any]:
    """The request header of a tree execution under ``limits``."""
    return request_header(
        code_len=0, timeout_s=timeout, memory_bytes=limits.memory_bytes, cpu_s=limits.cpu_s,
        fsize=limits.fsize_bytes, nofile=limits.nofile, nproc=limits.nproc,
        session_memory_bytes=session_memory_bytes,
    )


class _TreeSession(_SessionBase):
    """A session whose interpreter is one :class:`Tree` (bubblewrap and unsafe-local): subclasses
    say how to get a new tree (:meth:`_new_tree`) and what else to free (:meth:`_free`)."""

    def __init__(self, sandbox: Any, memory_mb: int) -> None:
        super().__init__(sandbox, memory_mb)
        self._tree: Tree | None = None
        self._started = False

    async def _new_tree(self) -> Tree:
        raise NotImplementedError

    def _free(self) -> None:
        """Release what the session holds besides its tree."""

    async def start(self) -> None:
        """Start the session's interpreter (``async with`` does this).

        Raises:
            SandboxError: the session or its sandbox is closed, or it could not be started.
        """
        self._check_startable()
        if self._tree is None:
            self._tree = await self._new_tree()
        self._started = True
        self.sandbox._sessions.add(self)

    async def run(
        self, code: str, *, timeout_s: float | None = None, memory_mb: int | None = None
    ) -> ExecResult:
        """Run one cell; see :meth:`agentrl.sandbox.SandboxSession.run`."""
        sb = self.sandbox
        timeout, limits = self._cell_limits(timeout_s, memory_mb)
        if self._tree is None:
            if self._started:
                self.restarts += 1
            await self.start()
        tree = self._tree
        assert tree is not None
        async with sb._limiter.get():
            outcome = await run_on_tree(
                tree, code, _header(limits, timeout, self.memory_mb * 1024 * 1024),
                timeout_s=timeout, max_output_bytes=sb.max_output_bytes, session=True,
            )
        if outcome.error is not None or outcome.state_lost:
            tree.close()
            self._tree = None
        if outcome.error is not None:
            raise SandboxError(f"{self._what}: {outcome.error}")
        return _to_result(outcome.raw, what=self._what, state_lost=outcome.state_lost)

    async def aclose(self) -> None:
        """Kill the interpreter and everything it started."""
        self._closed = True
        self.sandbox._sessions.discard(self)
        if self._tree is not None:
            self._tree.close()
            self._tree = None
        self._free()

