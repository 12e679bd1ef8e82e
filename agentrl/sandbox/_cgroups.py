"""Control groups for sandboxed executions, host side: one bound on a whole process tree.

rlimits bound each process on its own, so code that starts many processes can use many times
``memory_mb`` in total. A cgroup bounds the tree as a whole: memory (no swap), process count and
CPU bandwidth, whatever the code forks.

How a sandboxed process joins one. The host (root) creates the cgroup and opens its
``cgroup.procs`` for writing. The descriptor goes to the sandboxed process with its request, and
the process writes ``0`` ("myself") to it and closes it before the code runs. The kernel checks a
migration against the credentials and cgroup namespace of whoever *opened* the file (Linux ≥ 5.16
for cgroup v1 and v2), so the sandbox needs no capability, no view of ``/sys/fs/cgroup``, and can
join no other cgroup. Everything the code starts inherits the cgroup.

Where the cgroups go. Under the engine's own cgroup, in a directory ``agentrl-<ns>-<pid>-<n>`` per
sandbox (``<pid>``: the engine's process, ``<ns>``: its PID namespace), in every hierarchy that
holds one of the controllers (empty ones left by engines of this PID namespace that died are
removed):

* **cgroup v2** (the unified hierarchy, what current distributions mount): the engine's cgroup
  must list ``memory`` and ``pids`` in ``cgroup.controllers`` and be able to enable them for its
  children. The kernel refuses that while the engine's cgroup holds processes itself (the
  no-internal-process rule; only the root cgroup is exempt), which is the case unless the cgroup
  was delegated (``systemd-run --scope -p Delegate=yes``, or a container whose processes sit in a
  leaf). Then cgroups are not used, and :func:`describe` says why.
* **cgroup v1** (one hierarchy per controller, as on this project's machines): ``memory`` and
  ``pids`` must be mounted; ``cpu`` is used when mounted.

What the limits mean (:meth:`Cgroup.set_limits`):

* memory: ``memory.max`` (v2) or ``memory.limit_in_bytes`` (v1), with swap shut off
  (``memory.swap.max = 0``; v1: ``memory.memsw.limit_in_bytes`` equal to the limit, where the
  kernel accounts swap). When the tree goes over, the kernel's OOM killer kills a process of the
  tree, and the execution reports ``memory_exceeded``.
* pids: ``pids.max``, processes and threads of the tree together.
* CPU: ``cpu.max`` (v2) or ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (v1): at most ``cpus``
  cores' worth of CPU time per period (100 ms); the tree is throttled, not killed.

Nothing here runs inside a sandbox; the guest side is :func:`agentrl.sandbox.guest.limits.join_cgroups`.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass

from agentrl.errors import SandboxUnavailable

__all__ = ["Cgroup", "CgroupRoot", "CgroupsUnavailable", "describe", "open_root"]

log = logging.getLogger(__name__)

#: Controllers a sandbox needs (without both, cgroups are not used).
REQUIRED = ("memory", "pids")
#: Controllers used when they are there.
OPTIONAL = ("cpu",)
#: CPU bandwidth period (microseconds).
CPU_PERIOD_US = 100_000
#: How long :meth:`Cgroup.remove` waits for killed processes to leave a cgroup.
REMOVE_WAIT_S = 5.0

_counter = itertools.count()


class CgroupsUnavailable(SandboxUnavailable):
    """This host does not let the engine create cgroups (the message says why)."""


@dataclass(frozen=True)
class _Mount:
    version: int  # 1 or 2
    controllers: tuple[str, ...]  # v1: the hierarchy's controllers; v2: ()
    root: str  # the mount's root within the hierarchy (mountinfo field 4)
    path: str  # where it is mounted


def _mounts(mountinfo: str) -> list[_Mount]:
    out = []
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(fields) < 5 or len(rfields) < 3:
            continue
        fstype = rfields[0]
        if fstype == "cgroup2":
            out.append(_Mount(2, (), fields[3], fields[4]))
        elif fstype == "cgroup":
            opts = rfields[2].split(",")
            ctrls = tuple(o for o in opts if o in (*REQUIRED, *OPTIONAL, "cpuacct", "cpuset"))
            if ctrls:
                out.append(_Mount(1, ctrls, fields[3], fields[4]))
    return out


def _own_paths(proc_cgroup: str) -> tuple[str | None, dict[str, str]]:
    """(the v2 path, {v1 controller: path}) of this process, from /proc/self/cgroup."""
    v2, v1 = None, {}
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _id, ctrls, path = parts
        if ctrls == "":
            v2 = path
        else:
            for c in ctrls.split(","):
                v1[c] = path
    return v2, v1


def _directory(mount: _Mount, path: str) -> str:
    rel = os.path.relpath(path, mount.root) if mount.root != "/" else path.lstrip("/")
    if rel.startswith(".."):  # outside what this mount shows (another cgroup namespace)
        raise CgroupsUnavailable(f"the engine's cgroup {path} is not visible under {mount.path}")
    return os.path.normpath(os.path.join(mount.path, rel))


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


class CgroupRoot:
    """A sandbox's own cgroup directory (one per hierarchy), under which its groups go.

    Attributes:
        version: 1 or 2.
        controllers: the controllers in use (``memory``, ``pids``, and ``cpu`` when available).
        dirs: the directory of this root in each hierarchy (one for v2; per controller for v1).
    """

    def __init__(self, version: int, dirs: dict[str, str], controllers: tuple[str, ...]) -> None:
        self.version = version
        self.dirs = dirs
        self.controllers = controllers
        self._groups: set[Cgroup] = set()

    def group(self, name: str) -> Cgroup:
        """A new, empty cgroup ``name`` under this root (no limits yet: see :meth:`Cgroup.set_limits`)."""
        paths = {}
        for ctrl, d in self.dirs.items():
            p = os.path.join(d, name)
            if p not in paths.values():  # v2: one directory for every controller
                os.mkdir(p)
            paths[ctrl] = p
        g = Cgroup(self, paths)
        self._groups.add(g)
        return g

    def close(self) -> None:
        """Remove every group and the root's directories (processes left in them are killed)."""
        for g in list(self._groups):
            g.remove()
        for d in set(self.dirs.values()):
            _rmdir(d)

    def __repr__(self) -> str:
        return f"CgroupRoot(v{self.version}, {sorted(set(self.dirs.values()))})"


class Cgroup:
    """One cgroup (a directory per hierarchy): its limits, how to join it, what happened in it."""

    def __init__(self, root: CgroupRoot, paths: dict[str, str]) -> None:
        self.root = root
        self.paths = paths
        self._limits: tuple[int, int, float | None] | None = None
        self._procs_fds: list[int] = []

    def _file(self, ctrl: str, name: str) -> str:
        return os.path.join(self.paths[ctrl], name)

    def set_limits(self, *, memory_bytes: int, pids: int, cpus: float | None) -> None:
        """Bound the tree: ``memory_bytes`` of memory without swap, ``pids`` processes and
        threads, ``cpus`` cores of CPU time (None: no CPU bound). Writes only what changed."""
        want = (int(memory_bytes), int(pids), cpus)
        if want == self._limits:
            return
        v2 = self.root.version == 2
        if v2:
            _write(self._file("memory", "memory.max"), str(want[0]))
            try:
                _write(self._file("memory", "memory.swap.max"), "0")
            except FileNotFoundError:  # no swap accounting: no swap to bound
                pass
            _write(self._file("pids", "pids.max"), str(want[1]))
            if "cpu" in self.paths:
                quota = "max" if cpus is None else str(max(1000, int(cpus * CPU_PERIOD_US)))
                _write(self._file("cpu", "cpu.max"), f"{quota} {CPU_PERIOD_US}")
        else:
            mem = self._file("memory", "memory.limit_in_bytes")
            memsw = self._file("memory", "memory.memsw.limit_in_bytes")
            has_memsw = os.path.exists(memsw)
            current = int(_read(mem))
            # memsw must stay >= the memory limit at every step
            order = [(memsw, mem), (mem, memsw)][want[0] < current]
            for path in order:
                if path == memsw and not has_memsw:
                    continue
                _write(path, str(want[0]))
            _write(self._file("pids", "pids.max"), str(want[1]))
            if "cpu" in self.paths:
                _write(self._file("cpu", "cpu.cfs_period_us"), str(CPU_PERIOD_US))
                quota = -1 if cpus is None else max(1000, int(cpus * CPU_PERIOD_US))
                _write(self._file("cpu", "cpu.cfs_quota_us"), str(quota))
        self._limits = want

    def procs_fds(self) -> list[int]:
        """Descriptors of ``cgroup.procs`` open for writing, one per hierarchy (kept open by this
        object; send them to the sandboxed process, which writes ``0`` to each to join)."""
        if not self._procs_fds:
            for d in sorted(set(self.paths.values())):
                self._procs_fds.append(os.open(os.path.join(d, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC))
        return list(self._procs_fds)

    def oom_kills(self) -> int:
        """How many processes the kernel's OOM killer has killed in this cgroup so far."""
        name = "memory.events" if self.root.version == 2 else "memory.oom_control"
        try:
            text = _read(self._file("memory", name))
        except OSError:
            return 0
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def processes(self) -> list[int]:
        """Host pids of the processes in this cgroup."""
        pids: set[int] = set()
        for d in set(self.paths.values()):
            try:
                pids.update(int(p) for p in _read(os.path.join(d, "cgroup.procs")).split())
            except OSError:
                pass
        return sorted(pids)

    def kill(self) -> None:
        """SIGKILL every process in the cgroup."""
        for pid in self.processes():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def remove(self) -> None:
        """Kill what is left in the cgroup and remove its directories (idempotent)."""
        for fd in self._procs_fds:
            os.close(fd)
        self._procs_fds = []
        end = time.monotonic() + REMOVE_WAIT_S
        while self.paths:
            self.kill()
            for d in set(self.paths.values()):
                if _rmdir(d, quiet=True):
                    self.paths = {c: p for c, p in self.paths.items() if p != d}
            if not self.paths:
                break
            if time.monotonic() > end:
                log.warning("sandbox cgroups: %s still hold processes; left in place", sorted(self.paths.values()))
                break
            time.sleep(0.005)
        self.root._groups.discard(self)


def _rmdir(path: str, quiet: bool = False) -> bool:
    try:
        os.rmdir(path)
        return True
    except FileNotFoundError:
        return True
    except OSError as exc:
        if not quiet and exc.errno != errno.EBUSY:
            log.warning("sandbox cgroups: cannot remove %s: %s", path, exc)
        return False


def _pid_namespace() -> str:
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return "0"


def _remove_stale(parent: str) -> None:
    """Remove ``agentrl-<ns>-<pid>-*`` directories of engines of this PID namespace that no longer
    run (empty ones only; other namespaces' pids cannot be checked from here)."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    ns = _pid_namespace()
    for name in names:
        parts = name.split("-")
        if len(parts) != 4 or parts[0] != "agentrl" or parts[1] != ns or not parts[2].isdigit():
            continue
        if int(parts[2]) == os.getpid() or os.path.exists(f"/proc/{parts[2]}"):
            continue
        top = os.path.join(parent, name)
        for sub in _subdirs(top):
            _rmdir(os.path.join(top, sub), quiet=True)
        _rmdir(top, quiet=True)


def _subdirs(path: str) -> Iterable[str]:
    try:
        return [e.name for e in os.scandir(path) if e.is_dir()]
    except OSError:
        return []


def open_root(*, proc: str = "/proc/self") -> CgroupRoot:
    """Create this sandbox's cgroup root (see the module docstring for where and when).

    Args:
        proc: where to read ``mountinfo`` and ``cgroup`` from (a test points it at fixtures).

    Raises:
        CgroupsUnavailable: no usable hierarchy, or the engine may not create cgroups there (the
            message says which and why).
    """
    try:
        mounts = _mounts(_read(os.path.join(proc, "mountinfo")))
        v2_path, v1_paths = _own_paths(_read(os.path.join(proc, "cgroup")))
    except OSError as exc:
        raise CgroupsUnavailable(f"cannot read this process's cgroups: {exc}") from None
    name = f"agentrl-{_pid_namespace()}-{os.getpid()}-{next(_counter)}"
    reasons = []
    v2 = next((m for m in mounts if m.version == 2), None)
    if v2 is not None and v2_path is not None:
        try:
            return _open_v2(v2, v2_path, name)
        except CgroupsUnavailable as exc:
            reasons.append(str(exc))
    v1 = {c: m for m in mounts if m.version == 1 for c in m.controllers}
    if all(c in v1 for c in REQUIRED):
        try:
            return _open_v1(v1, v1_paths, name)
        except CgroupsUnavailable as exc:
            reasons.append(str(exc))
    elif v1:
        reasons.append(f"cgroup v1: {', '.join(c for c in REQUIRED if c not in v1)} not mounted")
    if not reasons:
        reasons.append("no cgroup filesystem is mounted")
    raise CgroupsUnavailable("; ".join(reasons))


def _open_v2(mount: _Mount, own: str, name: str) -> CgroupRoot:
    base = _directory(mount, own)
    try:
        available = _read(os.path.join(base, "cgroup.controllers")).split()
    except OSError as exc:
        raise CgroupsUnavailable(f"cgroup v2: cannot read {base}/cgroup.controllers: {exc}") from None
    missing = [c for c in REQUIRED if c not in available]
    if missing:
        raise CgroupsUnavailable(f"cgroup v2: {', '.join(missing)} not available in {base}")
    ctrls = tuple(c for c in (*REQUIRED, *OPTIONAL) if c in available)
    enable = " ".join(f"+{c}" for c in ctrls)
    try:
        if not set(ctrls) <= set(_read(os.path.join(base, "cgroup.subtree_control")).split()):
            _write(os.path.join(base, "cgroup.subtree_control"), enable)
    except OSError as exc:
        why = (
            "it holds processes itself (the engine's), and cgroup v2 enables controllers for "
            "children only of a cgroup without processes; run the engine in a delegated cgroup "
            "(e.g. systemd-run --scope -p Delegate=yes)"
            if exc.errno == errno.EBUSY else str(exc)
        )
        raise CgroupsUnavailable(f"cgroup v2: cannot enable {', '.join(ctrls)} for children of {base}: {why}") from None
    _remove_stale(base)
    top = os.path.join(base, name)
    try:
        os.mkdir(top)
        _write(os.path.join(top, "cgroup.subtree_control"), enable)
    except OSError as exc:
        _rmdir(top, quiet=True)
        raise CgroupsUnavailable(f"cgroup v2: cannot create {top}: {exc}") from None
    return CgroupRoot(2, {c: top for c in ctrls}, ctrls)


def _open_v1(mounts: dict[str, _Mount], own: dict[str, str], name: str) -> CgroupRoot:
    ctrls = tuple(c for c in (*REQUIRED, *OPTIONAL) if c in mounts)
    dirs: dict[str, str] = {}
    made: list[str] = []
    try:
        for c in ctrls:
            base = _directory(mounts[c], own.get(c, "/"))
            top = os.path.join(base, name)
            if top not in made:
                _remove_stale(base)
                os.mkdir(top)
                made.append(top)
            dirs[c] = top
    except OSError as exc:
        for d in made:
            _rmdir(d, quiet=True)
        raise CgroupsUnavailable(f"cgroup v1: cannot create a cgroup: {exc}") from None
    return CgroupRoot(1, dirs, ctrls)


def describe() -> str:
    """One line for ``agentrl check --dry-run``: which cgroups a bubblewrap sandbox would use."""
    try:
        root = open_root()
    except CgroupsUnavailable as exc:
        return f"cgroups unavailable ({exc}): rlimits per process only"
    try:
        parents = sorted({os.path.dirname(d) for d in root.dirs.values()})
        return (
            f"cgroup v{root.version} ({', '.join(root.controllers)}) per execution tree, under "
            f"{', '.join(parents)}; plus rlimits per process"
        )
    finally:
        root.close()
