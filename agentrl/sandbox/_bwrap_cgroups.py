"""The cgroups a :class:`~agentrl.sandbox.bubblewrap.BubblewrapSandbox` bounds its execution trees
with (:class:`TreeCgroups`): one per warm worker, which its one-shot executions join one at a time;
one per per-execution container, kept and reused; one per session, for the session's whole life.
Each is bounded to an execution's limits plus what copy-on-write may copy of the process the tree
was forked from, plus :data:`CGROUP_SLACK_BYTES`. An OOM kill in the tree marks the result
``memory_exceeded`` (:func:`with_oom`).

The host's hierarchy (where the cgroups go, v1 or delegated v2, writing the limits, counting OOM
kills) is :mod:`agentrl.sandbox._cgroups`; the threat model's "resources spread over many
processes" is :mod:`agentrl.sandbox`'s.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

from agentrl.errors import SandboxError
from agentrl.sandbox._cgroups import Cgroup, CgroupRoot
from agentrl.sandbox._limits import Limits
from agentrl.sandbox._warm import WarmWorker
from agentrl.sandbox.base import ExecResult

__all__ = ["CGROUP_SLACK_BYTES", "TreeCgroups", "with_oom"]

#: Memory a cgroup allows beyond ``memory_mb`` and copy-on-write (bytes): the guest's own
#: bookkeeping after it joined, kernel objects charged to the tree (page tables, sockets, pipes).
CGROUP_SLACK_BYTES = 16 * 1024 * 1024


class TreeCgroups:
    """The cgroups of one sandbox's trees, under its cgroup root.

    Args:
        root: the sandbox's own cgroup directory; None without cgroups (then every method that
            gives a cgroup gives None).
        cpus: the CPU bandwidth of one tree, in cores (None: unbounded).

    Attributes:
        root: as above; None also once :meth:`close` ran.
        cpus: as above.
    """

    def __init__(self, root: CgroupRoot | None, cpus: float | None) -> None:
        self.root = root
        self.cpus = cpus
        self._names = itertools.count()
        #: Per-execution containers' cgroups, empty and kept for the next container.
        self._spare: list[Cgroup] = []

    def new(self, prefix: str, limits: Limits, allowance: int) -> Cgroup | None:
        """A cgroup bounding a tree to ``limits`` plus ``allowance`` bytes of memory (what
        copy-on-write may copy of the process it was forked from), or None without cgroups."""
        if self.root is None:
            return None
        try:
            group = self.root.group(f"{prefix}{next(self._names)}")
            self.bound(group, limits, allowance)
        except OSError as exc:
            raise SandboxError(f"bubblewrap sandbox: cannot set up a cgroup: {exc}") from exc
        return group

    def bound(self, group: Cgroup, limits: Limits, allowance: int) -> None:
        """Set ``group``'s limits: ``limits`` plus ``allowance`` bytes of memory (raises OSError)."""
        group.set_limits(
            memory_bytes=limits.memory_bytes + allowance + CGROUP_SLACK_BYTES,
            pids=limits.nproc, cpus=self.cpus,
        )

    def for_container(self, limits: Limits) -> Cgroup | None:
        """A cgroup for one per-execution container (kept and reused: creating and removing
        memory cgroups costs milliseconds), bounded to ``limits``; give it back with
        :meth:`container_done`."""
        if self.root is None:
            return None
        if not self._spare:
            return self.new("x", limits, 0)
        group = self._spare.pop()
        try:
            self.bound(group, limits, 0)
        except OSError as exc:
            group.remove()
            raise SandboxError(f"bubblewrap sandbox: cannot set a cgroup's limits: {exc}") from exc
        return group

    def container_done(self, group: Cgroup, *, closed: bool) -> None:
        """Keep a per-execution container's cgroup for the next one, unless something of the
        execution is left in it or the sandbox is ``closed`` (then it is removed)."""
        if group.processes() or closed:
            group.remove()
        else:
            self._spare.append(group)

    def for_worker(self, worker: WarmWorker, limits: Limits) -> Cgroup | None:
        """The cgroup a warm worker's one-shot executions run in (one at a time), bounded to
        ``limits``."""
        if self.root is None:
            return None
        if worker.cgroup is None:
            worker.cgroup = self.new("w", limits, worker.anon_bytes)
            return worker.cgroup
        try:
            self.bound(worker.cgroup, limits, worker.anon_bytes)
        except OSError as exc:
            raise SandboxError(f"bubblewrap sandbox: cannot set a cgroup's limits: {exc}") from exc
        return worker.cgroup

    def close(self) -> None:
        """Remove every cgroup and the root's directories (processes left in them are killed)."""
        if self.root is not None:
            self.root.close()
            self.root = None


def with_oom(result: ExecResult, group: Cgroup | None, before: int) -> ExecResult:
    """``result``, marked ``memory_exceeded`` when the kernel's OOM killer killed a process of
    ``group`` since it had killed ``before``."""
    if group is not None and not result.memory_exceeded and group.oom_kills() > before:
        return replace(result, memory_exceeded=True)
    return result
