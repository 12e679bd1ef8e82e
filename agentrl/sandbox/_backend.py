"""What the sandbox backends (:mod:`~agentrl.sandbox.bubblewrap`, :mod:`~agentrl.sandbox.docker`,
:mod:`~agentrl.sandbox.local`) are built on: the settings, concurrency limiter, session registry
and context-manager plumbing of a sandbox (:class:`SandboxBase`) and of a session
(:class:`SessionBase`), and the session whose interpreter is a :class:`~agentrl.sandbox._tree.Tree`
(:class:`TreeSession`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, TypeVar

import anyio
import sniffio

from agentrl.errors import SandboxError
from agentrl.sandbox._limits import Limits, check_settings, run_settings
from agentrl.sandbox._process import to_result
from agentrl.sandbox._tree import Tree, request_header, run_on_tree
from agentrl.sandbox.base import ExecResult

_S = TypeVar("_S")


class LoopLocal:
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


class SandboxBase:
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
        check_settings(
            max_concurrency=max_concurrency, timeout_s=timeout_s, memory_mb=memory_mb,
            max_output_bytes=max_output_bytes, max_processes=max_processes,
        )
        self.timeout_s = float(timeout_s)
        self.memory_mb = int(memory_mb)
        self.max_output_bytes = int(max_output_bytes)
        self.max_processes = int(max_processes)
        self.max_concurrency = int(max_concurrency)
        self._limiter = LoopLocal(self.max_concurrency)
        self._closed = False
        self._sessions: set[Any] = set()

    def _run_limits(
        self, name: str, timeout_s: float | None, memory_mb: int | None
    ) -> tuple[float, Limits]:
        """The deadline and limits of one ``run`` call (raises SandboxError once closed)."""
        if self._closed:
            raise SandboxError(f"{name}.run called after aclose()")
        timeout, memory = run_settings(timeout_s, memory_mb, self.timeout_s, self.memory_mb)
        return timeout, Limits.for_run(
            timeout_s=timeout, memory_mb=memory, max_processes=self.max_processes
        )

    def _session_memory(self, memory_mb: int | None) -> int:
        _, memory = run_settings(None, memory_mb, self.timeout_s, self.memory_mb)
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


class SessionBase:
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

    def _cell_limits(self, timeout_s: float | None, memory_mb: int | None) -> tuple[float, Limits]:
        """The deadline and limits of one cell (raises SandboxError once closed)."""
        sb = self.sandbox
        if self._closed or sb._closed:
            raise SandboxError(f"{self._what}: run called after aclose()")
        timeout, memory = run_settings(timeout_s, memory_mb, sb.timeout_s, self.memory_mb)
        return timeout, Limits.for_run(
            timeout_s=timeout, memory_mb=min(memory, self.memory_mb), max_processes=sb.max_processes
        )


class TreeSession(SessionBase):
    """A session whose interpreter is one :class:`Tree` (bubblewrap and unsafe-local): subclasses
    say how to get a new tree (:meth:`_new_tree`) and what else to free (:meth:`_free`)."""

    def __init__(self, sandbox: Any, memory_mb: int) -> None:
        super().__init__(sandbox, memory_mb)
        self._tree: Tree | None = None
        self._started = False

    async def _new_tree(self) -> Tree:
        raise NotImplementedError

    def _cgroup_fds(self, limits: Limits) -> tuple[int, ...]:
        """``cgroup.procs`` descriptors every cell joins (none by default; the caller keeps them)."""
        return ()

    def _oom_kills(self) -> int:
        """OOM kills in the session's cgroup so far (0 without one)."""
        return 0

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
            try:
                cgroup_fds = self._cgroup_fds(limits)
            except OSError as exc:
                raise SandboxError(f"{self._what}: cannot set up a cgroup: {exc}") from exc
            ooms = self._oom_kills()
            outcome = await run_on_tree(
                tree, code, request_header(limits, timeout, self.memory_mb * 1024 * 1024),
                timeout_s=timeout, max_output_bytes=sb.max_output_bytes, session=True,
                extra_fds=cgroup_fds,
            )
        if outcome.error is not None or outcome.state_lost:
            tree.close()
            self._tree = None
        if outcome.error is not None:
            raise SandboxError(f"{self._what}: {outcome.error}")
        result = to_result(outcome.raw, what=self._what, state_lost=outcome.state_lost)
        if not result.memory_exceeded and self._oom_kills() > ooms:
            result = replace(result, memory_exceeded=True)
        return result

    async def aclose(self) -> None:
        """Kill the interpreter and everything it started."""
        self._closed = True
        self.sandbox._sessions.discard(self)
        if self._tree is not None:
            self._tree.close()
            self._tree = None
        self._free()

