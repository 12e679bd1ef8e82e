"""The session of a bubblewrap sandbox (:class:`BubblewrapSession`, re-exported by
:mod:`agentrl.sandbox.bubblewrap`, whose docstring is the design): one tree whose ``U`` keeps one
``__main__`` namespace across cells, with a network namespace of its own, forked by a warm worker
(warm mode) or by a worker without preloads started for the session (per-execution mode), and
bounded by one cgroup for the session's whole life.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from agentrl.errors import SandboxError
from agentrl.sandbox._backend import TreeSession
from agentrl.sandbox._cgroups import Cgroup
from agentrl.sandbox._limits import Limits
from agentrl.sandbox._tree import Tree
from agentrl.sandbox._warm import WarmWorker

__all__ = ["BubblewrapSession"]


class BubblewrapSession(TreeSession):
    """A session of a :class:`~agentrl.sandbox.bubblewrap.BubblewrapSandbox` (see
    :class:`agentrl.sandbox.SandboxSession`).

    Args:
        sandbox: the :class:`~agentrl.sandbox.bubblewrap.BubblewrapSandbox` it belongs to (typed
            loosely: that module imports this one, and an import back would be a cycle).
        memory_mb: the session's memory limit in MiB (see
            :meth:`agentrl.sandbox.SessionSandbox.session`; with cgroups also what its processes
            may use together, plus what copy-on-write may copy of the worker its interpreter was
            forked from).

    Attributes:
        restarts: how many times the interpreter was started afresh after losing its state.
    """

    _what = "bubblewrap session"

    def __init__(self, sandbox: Any, memory_mb: int) -> None:
        super().__init__(sandbox, memory_mb)
        self._own_worker: WarmWorker | None = None
        self._cgroup: Cgroup | None = None
        self._allowance = 0  # anonymous memory of the worker the interpreter was forked from

    def _free(self) -> None:
        if self._own_worker is not None:
            self.sandbox._pool.discard(self._own_worker)
            self._own_worker = None
        if self._cgroup is not None:
            self._cgroup.remove()
            self._cgroup = None

    def _cgroup_fds(self, limits: Limits) -> tuple[int, ...]:
        """The session's cgroup (one for its whole life, restarts included), bounded by the
        session's memory: every cell joins it."""
        sb = self.sandbox
        if sb._cgroups is None:
            return ()
        session_limits = replace(limits, memory_bytes=self.memory_mb * 1024 * 1024)
        if self._cgroup is None:
            self._cgroup = sb._tree_cgroups.new("s", session_limits, self._allowance)
        assert self._cgroup is not None
        return tuple(self._cgroup.procs_fds())

    def _oom_kills(self) -> int:
        return self._cgroup.oom_kills() if self._cgroup is not None else 0

    async def _new_tree(self) -> Tree:
        sb = self.sandbox
        if sb.warm:
            async with sb._limiter.get():
                for attempt in range(2):
                    worker = await sb._pool.wait("full")
                    try:
                        tree = await worker.take("session")
                    except SandboxError:
                        sb._pool.discard(worker)
                        if attempt:
                            raise
                        continue
                    sb._pool.release(worker, True, sb._closed)
                    self._allowance = max(self._allowance, worker.anon_bytes)
                    return tree
            raise AssertionError("unreachable")
        # Per-execution mode: a dedicated worker without preloads serves this session only.
        if self._own_worker is None or not self._own_worker.alive():
            if self._own_worker is not None:
                sb._pool.discard(self._own_worker)
            self._own_worker = sb._pool.launch("session", track=False)
            try:
                await self._own_worker.wait_ready()
            except BaseException:
                sb._pool.discard(self._own_worker)
                self._own_worker = None
                raise
        self._allowance = max(self._allowance, self._own_worker.anon_bytes)
        return await self._own_worker.take("session")
