"""Warm bubblewrap workers, host side: one container running the fork server
(:class:`agentrl.sandbox.guest.warm.WarmServer`), the pool of them a sandbox keeps, and which kind of
worker an execution goes to.

Two kinds serve one-shot executions. A *full* worker has imported the sandbox's preloads (numpy
and sympy by default), so code that uses them pays no import; a *lean* one has imported nothing,
so the process it forks per execution is a fraction of the size (fewer page tables to copy, fewer
copy-on-write faults, a cheaper exit). :class:`ImportRouter` sends an execution to a full worker
when its text names a module the full workers loaded (``import sympy``, ``from numpy import``,
``__import__("mpmath")``: any mention), and to a lean one otherwise; a lean worker can still
import anything, only slower.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from typing import Any

import anyio

from agentrl.errors import SandboxError, SandboxUnavailable
from agentrl.sandbox._cgroups import Cgroup
from agentrl.sandbox._layout import SANDBOX_UID
from agentrl.sandbox._process import kill_group
from agentrl.sandbox._tree import AsyncConn, Tree
from agentrl.sandbox.guest.wire import HDR, frame

__all__ = ["ImportRouter", "WarmPool", "WarmWorker", "new_userns"]

log = logging.getLogger(__name__)

class WarmWorker:
    """One warm ``bwrap`` container running the fork server (host side).

    Args:
        kind: ``"full"`` (imports the sandbox's preloads), ``"lean"`` (none: a smaller process
            to fork, for code that imports none of them) or ``"session"`` (no preloads; serves
            one session of a per-execution-mode sandbox).
        argv: the command line that starts it, given the guest's end of the control channel, a
            user-namespace descriptor and the descriptor holding ``code`` (None without).
        startup_timeout_s: longest wait for its ``ready``.
        stats: the sandbox's counters (``trees_reused`` is counted here).
        code: the compiled guest program (:func:`agentrl.sandbox._launch.guest_code`), handed
            to bwrap on a memfd; None: the server compiles the source.

    Attributes:
        cgroup: the cgroup its one-shot executions run in (made on first use by the sandbox,
            removed with the worker), or None.
        anon_bytes: the server's resident anonymous memory when it said ready (bytes): the most
            copy-on-write can copy into an execution's cgroup.
        modules: top-level names of the modules the server holds beyond a bare interpreter.
    """

    def __init__(
        self, kind: str, argv: Callable[[int, int, int | None], list[str]], startup_timeout_s: float,
        stats: Any, code: bytes | None = None,
    ) -> None:
        self.kind = kind
        self._argv = argv
        self._code = code
        self.startup_timeout_s = startup_timeout_s
        self.stats = stats
        self.cgroup: Cgroup | None = None
        self.anon_bytes = 0
        self.modules: list[str] = []
        self.proc: subprocess.Popen[bytes] | None = None
        self.ctl: socket.socket | None = None
        self.stderr: Any = None
        self.loaded: list[str] = []
        self.dead = False
        self.ready = False
        self._watched = False
        self.launched_at = 0.0

    def launch(self) -> None:
        """Start the container (the server imports its modules on its own; see :meth:`poll_ready`).

        Raises:
            SandboxError: bwrap could not be started.
        """
        host_end, guest_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            userns = new_userns()
        except BaseException:
            host_end.close()
            guest_end.close()
            raise
        self.stderr = tempfile.TemporaryFile()
        code_fd = None
        try:
            if self._code is not None:  # bwrap copies it into the container (--ro-bind-data)
                code_fd = os.memfd_create("agentrl-guest", 0)
                view = memoryview(self._code)
                while view:
                    view = view[os.write(code_fd, view):]
                os.lseek(code_fd, 0, os.SEEK_SET)
            argv = self._argv(guest_end.fileno(), userns, code_fd)
            fds = (guest_end.fileno(), userns) + (() if code_fd is None else (code_fd,))
            try:
                # From the event loop's thread: bwrap's --die-with-parent follows this thread.
                self.proc = subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.stderr,
                    env={"PATH": "/usr/bin:/bin"}, pass_fds=fds, start_new_session=True,
                )
            except OSError as exc:
                host_end.close()
                raise SandboxError(f"bubblewrap sandbox: cannot start {argv[0]!r}: {exc}") from exc
        finally:
            guest_end.close()
            os.close(userns)
            if code_fd is not None:
                os.close(code_fd)
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
            if time.monotonic() - self.launched_at > self.startup_timeout_s:
                self._fail(f"a warm worker did not start within {self.startup_timeout_s:g} s")
            return False
        except OSError:
            data = b""
        msg: dict[str, Any] | None = None
        if data:
            try:
                msg = json.loads(data[HDR.size:])
            except ValueError:
                msg = None
        if not isinstance(msg, dict) or msg.get("event") != "ready":
            detail = msg.get("message") if isinstance(msg, dict) else None
            self._fail(f"a warm worker failed to start: {detail or 'it exited'}")
        assert msg is not None
        self.loaded = list(msg.get("loaded", []))
        self.modules = [m for m in msg.get("modules", []) if isinstance(m, str)]
        try:
            self.anon_bytes = max(0, int(msg.get("anon_bytes", 0)))
        except (TypeError, ValueError):
            self.anon_bytes = 0
        self.ready = True
        return True

    async def _watch(self) -> None:
        """Until the control socket may have something to read. anyio lets one task at a time
        watch a socket (a second is refused: BusyResourceError), and several may be waiting on
        one worker: tasks still waiting for it to be ready, and the one that already found it
        ready by polling and asks it for a tree. The first watches; the others look again after
        10 ms. (No lock: a worker may serve asyncio and trio loops one after the other.)"""
        assert self.ctl is not None
        if self._watched:
            await anyio.sleep(0.01)
            return
        self._watched = True
        try:
            await anyio.wait_readable(self.ctl)
        finally:
            self._watched = False

    async def wait_ready(self) -> None:
        """Wait until :meth:`poll_ready` says ready (or raises). Several tasks may wait on one
        worker, and the one that holds it may already ask it for a tree (it found it ready by
        polling): they take turns watching its socket (:meth:`_watch`)."""
        while not self.poll_ready():
            with anyio.move_on_after(0.5):
                await self._watch()

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
        if self.ctl is None or not self.alive():
            # Its container's process has exited: the server inside may linger a moment (it dies
            # with its parent, asynchronously) and could still hand out a tree about to be killed.
            raise SandboxError("bubblewrap sandbox: the warm worker is gone")
        try:
            self.ctl.send(frame({"op": "take", "kind": kind}))
        except OSError as exc:
            raise SandboxError(f"bubblewrap sandbox: the warm worker is gone: {exc}") from exc
        with anyio.move_on_after(30) as scope:
            msg, fds = await self._recv()
        want = 3 if kind == "exec" else 2  # exec trees: U's pidfd too (Tree.wait_code_gone)
        if scope.cancelled_caught or msg is None or msg.get("event") != "tree" or len(fds) != want:
            for fd in fds if not scope.cancelled_caught and msg is not None else ():
                os.close(fd)
            raise SandboxError(
                f"bubblewrap sandbox: the warm worker did not hand out a tree{self._stderr_note()}"
            )
        sock = socket.socket(fileno=fds[0])
        if kind == "exec" and msg.get("reused"):
            self.stats.trees_reused += 1
        return Tree(
            AsyncConn(sock), pidfd=fds[1], reusable=kind == "exec", code_pidfd=fds[2] if kind == "exec" else None
        )

    async def _recv(self) -> tuple[dict[str, Any] | None, list[int]]:
        """The server's next message and the descriptors it carries (watching the socket in
        turn with tasks still waiting for the worker to be ready: :meth:`_watch`)."""
        assert self.ctl is not None
        while True:
            try:
                data, fds, _flags, _addr = socket.recv_fds(self.ctl, 1 << 16, 4, socket.MSG_CMSG_CLOEXEC)
            except BlockingIOError:
                await self._watch()
                continue
            except OSError:
                return None, []
            if not data:
                return None, fds
            try:
                return json.loads(data[HDR.size:]), fds
            except ValueError:
                for fd in fds:
                    os.close(fd)
                return {"event": "garbage"}, []

    def alive(self) -> bool:
        """Whether the container's process is running (never blocks; a worker killed a moment
        ago may still look alive: :meth:`ping` asks the server itself)."""
        return not self.dead and self.proc is not None and self.proc.poll() is None

    async def ping(self, timeout_s: float = 5.0) -> bool:
        """Whether the server answers on its control channel within ``timeout_s`` seconds (call
        only while holding the worker: nothing else may read the channel meanwhile)."""
        if self.ctl is None or not self.alive():
            return False
        try:
            self.ctl.send(frame({"op": "ping"}))
        except OSError:
            return False
        with anyio.move_on_after(timeout_s):
            msg, fds = await self._recv()
            for fd in fds:
                os.close(fd)
            return msg is not None and msg.get("event") == "pong"
        return False

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


class ImportRouter:
    """Which kind of warm worker an execution goes to (see the module docstring).

    Args:
        modules: top-level names of the modules full workers hold (the preloads at first; each
            ready full worker adds what it really loaded, e.g. ``mpmath`` under ``sympy``).
    """

    def __init__(self, modules: Iterable[str]) -> None:
        self.modules: set[str] = set()
        self._pattern: re.Pattern[str] | None = None
        self.add(modules)

    def add(self, modules: Iterable[str]) -> None:
        """Count ``modules`` (top-level names) as held by full workers too."""
        new = {m.split(".")[0] for m in modules if m} - self.modules
        if not new:
            return
        self.modules |= new
        names = "|".join(re.escape(m) for m in sorted(self.modules, key=len, reverse=True))
        self._pattern = re.compile(rf"\b(?:{names})\b")

    def kind(self, code: str) -> str:
        """``"full"`` when ``code`` mentions a module full workers hold, else ``"lean"``."""
        if self._pattern is None or self._pattern.search(code):
            return "full"
        return "lean"


class WarmPool:
    """The warm workers of a sandbox: launched on demand, ready ones kept idle, by kind.

    Args:
        launch: makes a worker of a kind (not started yet).
        cap: most workers of each kind.
        stats: the sandbox's counters (``workers_started``, ``workers_replaced``).
        on_ready: called with each worker once it is ready.
        on_discard: called with each worker the pool kills (to release what the sandbox keeps
            per worker, e.g. its cgroup).
    """

    def __init__(
        self, launch: Callable[[str], WarmWorker], cap: int, stats: Any,
        on_ready: Callable[[WarmWorker], None], on_discard: Callable[[WarmWorker], None],
    ) -> None:
        self._make = launch
        self.cap = cap
        self.stats = stats
        self._on_ready = on_ready
        self._on_discard = on_discard
        self.idle: dict[str, list[WarmWorker]] = {}
        self.launching: list[WarmWorker] = []
        self.workers: set[WarmWorker] = set()
        self._failure: SandboxError | None = None

    def _count(self, kind: str) -> int:
        return sum(1 for w in self.workers if w.kind == kind)

    def _became_ready(self, worker: WarmWorker) -> None:
        if worker in self.launching:
            self.launching.remove(worker)
        self._on_ready(worker)
        self.idle.setdefault(worker.kind, []).append(worker)

    def ready(self, kind: str) -> WarmWorker | None:
        """An idle, ready worker of ``kind``, or ``None`` (then one more is launched if there is
        room).

        Raises:
            SandboxError: the last worker launched failed to start (raised once; the next call
                launches again).
        """
        for worker in list(self.launching):
            try:
                ready = worker.poll_ready()
            except SandboxError as exc:
                self.launching.remove(worker)
                self.discard(worker)
                self._failure = exc
                continue
            if ready:
                self._became_ready(worker)
        idle = self.idle.get(kind, [])
        while idle:
            worker = idle.pop()
            if worker.alive():
                return worker
            self.stats.workers_replaced += 1
            self.discard(worker)
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure
        if self._count(kind) < self.cap:
            self.launch(kind)
        return None

    async def wait(self, kind: str) -> WarmWorker:
        """An idle, ready worker of ``kind``, waiting for one to start if need be. The worker is
        this caller's alone: when another caller took the one it waited for (two waiting on one
        launching worker, or :meth:`ready` handing it out once it was up), it waits again."""
        while True:
            worker = self.ready(kind)
            if worker is not None:
                return worker
            candidate = next((w for w in self.launching if w.kind == kind), None) or self.launch(kind)
            await self._await_ready(candidate)
            idle = self.idle.get(kind, [])
            if candidate in idle:
                idle.remove(candidate)
                return candidate

    def launch(self, kind: str, *, track: bool = True) -> WarmWorker:
        """Start a worker of ``kind`` (``track``: the pool polls it until ready; else the caller
        waits for it, as a session of a per-execution sandbox does)."""
        worker = self._make(kind)
        self.workers.add(worker)
        self.stats.workers_started += 1
        try:
            worker.launch()
        except BaseException:
            self.discard(worker)
            raise
        if track:
            self.launching.append(worker)
        return worker

    async def start(self, counts: dict[str, int]) -> None:
        """Launch workers until each kind has its count (at most the cap), and wait until all
        are ready.

        Raises:
            SandboxError: a worker could not start (the message carries its error output).
        """
        for kind, want in counts.items():
            while self._count(kind) < min(want, self.cap):
                self.launch(kind)
        for worker in list(self.launching):
            await self._await_ready(worker)

    async def _await_ready(self, worker: WarmWorker) -> None:
        """Wait until ``worker`` is ready (then it is idle), or kill it and raise SandboxError."""
        try:
            await worker.wait_ready()
        except SandboxError:
            self.discard(worker)
            raise
        if worker in self.launching:
            self._became_ready(worker)

    def release(self, worker: WarmWorker, ok: bool, closed: bool) -> None:
        """Give ``worker`` back after an execution (``ok``: it behaved; ``closed``: the sandbox
        is closed) or kill it."""
        if ok and not closed and worker.alive():
            self.idle.setdefault(worker.kind, []).append(worker)
        else:
            if not closed:
                self.stats.workers_replaced += 1
            self.discard(worker)

    def reap(self) -> int:
        """Kill and forget every idle worker whose process is gone (killed from outside between
        executions, as the OOM killer would); returns how many. Each counts as replaced, as
        :meth:`ready` counts one it finds dead; the next request launches a new one. Lets the
        sandbox's counters say a death before the next execution would have found it."""
        dead = [w for workers in self.idle.values() for w in workers if not w.alive()]
        for worker in dead:
            self.stats.workers_replaced += 1
            self.discard(worker)
        return len(dead)

    def discard(self, worker: WarmWorker) -> None:
        """Kill ``worker`` and forget it (idempotent)."""
        worker.kill()
        if worker in self.launching:
            self.launching.remove(worker)
        idle = self.idle.get(worker.kind, [])
        if worker in idle:
            idle.remove(worker)
        if worker in self.workers:
            self.workers.discard(worker)
            self._on_discard(worker)

    def close(self) -> None:
        """Kill every worker."""
        for worker in list(self.workers):
            self.discard(worker)
        self.idle.clear()
        self.launching.clear()


# Creates a user namespace and waits on stdin, so that the parent (root) can write its uid/gid maps
# and open /proc/<pid>/ns/user. 0x10000000 is CLONE_NEWUSER.
_UNSHARE_HELPER = (
    "import ctypes, os, sys\n"
    "ok = ctypes.CDLL(None, use_errno=True).unshare(0x10000000) == 0\n"
    "os.write(1, b'1' if ok else os.strerror(ctypes.get_errno()).encode())\n"
    "sys.stdin.read()\n"
)


def new_userns() -> int:
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
