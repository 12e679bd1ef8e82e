"""Host side of the guest protocol (:mod:`agentrl.sandbox.guest`): talking to execution trees.

A *tree* is a process (tree) ready to run code: the pre-forked ``I``/``U`` pair of a warm
bubblewrap worker, a session's persistent interpreter, or an unsafe-local session process. The host
sends it one request (header frame, the write ends of two fresh pipes for stdout and stderr, the
code), reads both pipes itself with a cap, reads the tree's events (``started``, then ``exit`` for
a one-shot tree, ``done`` or ``exit`` for a session cell), and at the deadline kills the tree's
whole PID namespace (pidfd of ``I``) or process group (unsafe-local). Everything here is
event-loop agnostic (anyio on raw descriptors), like :func:`agentrl.sandbox._process.run_process`.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import anyio

from agentrl.sandbox._limits import Limits
from agentrl.sandbox._process import (
    DRAIN_GRACE_S,
    Capture,
    Raw,
    drain,
    exited,
    kill_group,
)
from agentrl.sandbox.guest.wire import CHUNK, RELEASE, encode

#: Largest event frame accepted from a tree (they are tiny; anything bigger is garbage).
_MAX_EVENT = 1 << 16
#: How long to wait for a killed tree to disappear before declaring the worker broken.
_KILL_WAIT_S = 10.0


class AsyncConn:
    """A ``SOCK_SEQPACKET`` tree channel: one JSON object per message (any event loop).

    Messages the host cannot parse are skipped: once the code runs it can write to its own
    channel, and all it can do with that is misreport its own execution.
    """

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.eof = False

    async def _send(self, data: bytes, fds: tuple[int, ...] = ()) -> None:
        while True:
            try:
                if fds:
                    socket.send_fds(self.sock, [data], list(fds))
                else:
                    self.sock.send(data)
                return
            except BlockingIOError:
                await anyio.wait_writable(self.sock)

    async def send_request(self, header: dict[str, Any], code: bytes, fds: tuple[int, ...]) -> None:
        """The request header (``fds`` attached) and, after a newline in the same message, as
        much of the code as fits in one chunk; then the rest in chunks (one message for most
        code: :meth:`agentrl.sandbox.guest.wire.Packets.recv_request`)."""
        head = encode({**header, "code_len": len(code)})
        first = max(0, CHUNK - len(head) - 1)
        await self._send(head + b"\n" + code[:first], fds)
        for i in range(first, len(code), CHUNK):
            await self._send(code[i : i + CHUNK])

    async def recv(self) -> dict[str, Any] | None:
        """The next parsable message, or ``None`` at end of stream."""
        while not self.eof:
            try:
                data, fds, _flags, _addr = socket.recv_fds(self.sock, _MAX_EVENT, 4, socket.MSG_CMSG_CLOEXEC)
            except BlockingIOError:
                await anyio.wait_readable(self.sock)
                continue
            except OSError:
                data, fds = b"", []
            for fd in fds:  # nothing legitimate sends descriptors this way
                os.close(fd)
            if not data:
                self.eof = True
                break
            try:
                msg = json.loads(data)
            except ValueError:
                continue
            if isinstance(msg, dict):
                return msg
        return None

    def release(self) -> None:
        """Tell the warm server, as the last message before :meth:`close`, that this side
        leaves the tree's init alone (it may reset and reuse the tree); never blocks."""
        try:
            self.sock.send(RELEASE)
        except OSError:
            pass  # no release: the server kills the init instead of reusing it

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class Tree:
    """A process tree ready to run code, and how to kill it.

    Args:
        conn: the channel to the tree's ``U`` (and ``I``).
        pidfd: a pidfd of the tree's init ``I`` (bubblewrap): SIGKILL to it kills the whole PID
            namespace. ``None`` for a local session process.
        proc: the local session process (unsafe-local); its group is killed instead, and its exit
            status read from it.
        reusable: a one-shot tree whose init the warm server resets and reuses after a normal end
            (its ``U`` exited by itself after killing the rest of the tree): then the host leaves
            the init alone, says so with a last message on the channel
            (:data:`~agentrl.sandbox.guest.wire.RELEASE`) and closes it (:attr:`keep_init`): the
            server resets the tree only after both. Any other end kills the init as usual.
    """

    def __init__(
        self, conn: AsyncConn, *, pidfd: int | None = None, proc: subprocess.Popen[bytes] | None = None,
        reusable: bool = False, code_pidfd: int | None = None,
    ) -> None:
        self.conn = conn
        self.pidfd = pidfd
        self.code_pidfd = code_pidfd
        self.proc = proc
        self.reusable = reusable
        self.keep_init = False
        """Set by :func:`run_on_tree` after a normal end of a reusable tree: close without killing."""
        self.closed = False

    def kill(self) -> None:
        """SIGKILL the whole tree (idempotent, never blocks)."""
        if self.pidfd is not None:
            try:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            except (ProcessLookupError, OSError):
                pass
        if self.proc is not None and self.proc.returncode is None:
            kill_group(self.proc.pid)

    async def wait_dead(self) -> None:
        """Wait until the tree's init (or local process) has exited (its namespace is gone)."""
        if self.pidfd is not None:
            await anyio.wait_readable(self.pidfd)
        if self.proc is not None:
            while not exited(self.proc.pid):
                await anyio.sleep(0.005)
            self.proc.wait()

    async def wait_code_gone(self) -> None:
        """Wait until the tree's ``U`` has exited (bubblewrap one-shot trees). Its ``exit`` event
        is its own word: code that forged one and went on running would otherwise outlive its
        deadline (the server resets a tree only once ``U`` is gone)."""
        if self.code_pidfd is not None:
            await anyio.wait_readable(self.code_pidfd)

    def usable(self) -> bool:
        """Whether the tree can still take a request (never blocks): its init and, for a
        bubblewrap one-shot tree, its ``U`` are alive, and its channel is open. A tree fails this
        when something killed its processes after it was forked (it must not be handed the code)."""
        if self.closed or self.conn.eof:
            return False
        for fd in (self.pidfd, self.code_pidfd):
            if fd is not None and select.select([fd], [], [], 0)[0]:  # a pidfd is readable once its process exited
                return False
        return self.proc is None or self.proc.poll() is None

    def local_status(self) -> int | None:
        """The local process's wait-style return code once it has exited (Popen convention)."""
        if self.proc is None:
            return None
        return self.proc.poll()

    def close(self) -> None:
        """Kill the tree (unless :attr:`keep_init`) and release its descriptors."""
        if self.closed:
            return
        self.closed = True
        if not self.keep_init:
            self.kill()
        else:
            self.conn.release()
        self.conn.close()
        for fd in (self.pidfd, self.code_pidfd):
            if fd is not None:
                os.close(fd)
        self.pidfd = self.code_pidfd = None
        if self.proc is not None:
            try:
                self.proc.wait(timeout=_KILL_WAIT_S)
            except subprocess.TimeoutExpired:
                pass


@dataclass(frozen=True)
class Outcome:
    """What running one request on a tree gave.

    Attributes:
        raw: the observed run, for :func:`agentrl.sandbox._process.to_result`.
        state_lost: the tree is gone (its ``U`` exited or was killed): a session must start over.
        error: set when the infrastructure failed (the tree reported a setup error, or vanished
            without reporting an exit it did not owe us): the caller raises SandboxError.
    """

    raw: Raw
    state_lost: bool
    error: str | None = None


def request_header(
    limits: Limits, timeout_s: float, session_memory_bytes: int | None = None
) -> dict[str, Any]:
    """The request frame the guest expects: the deadline and ``limits`` (applied by
    :func:`agentrl.sandbox.guest.limits.apply_limits`); a session cell also sends the session's memory."""
    return {
        "code_len": 0,
        "timeout_s": timeout_s,
        **limits.request_fields(),
        "session_memory_bytes": session_memory_bytes,
    }


async def run_on_tree(
    tree: Tree,
    code: str,
    header: dict[str, Any],
    *,
    timeout_s: float,
    max_output_bytes: int,
    session: bool,
    extra_fds: Sequence[int] = (),
) -> Outcome:
    """Send one request to ``tree`` and supervise it until it ends or its deadline passes.

    A one-shot tree ends with ``exit`` (sent by ``I`` once ``U`` is gone and everything else in
    the namespace has been killed). A session cell ends with ``done`` (the interpreter lives on)
    or ``exit`` (it died: the state is lost). At the deadline the whole tree is SIGKILLed (a
    session loses its state). If the caller is cancelled, the tree is killed too.
    ``extra_fds`` go with the request after the two pipes (the ``cgroup.procs`` descriptors the
    code's process joins: :func:`agentrl.sandbox.guest.limits.join_cgroups`); the caller keeps them.
    """
    data = code.encode("utf-8", "surrogatepass")
    header = {**header, "code_len": len(data)}
    out, err = Capture(max_output_bytes), Capture(max_output_bytes)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    for fd in (out_r, err_r):
        os.set_blocking(fd, False)
    state: dict[str, Any] = {"started": False, "status": None, "done": None, "error": None}
    ended = False
    started_at = time.monotonic()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(drain, out_r, out)
            tg.start_soon(drain, err_r, err)
            with anyio.move_on_after(timeout_s) as scope:
                try:
                    await tree.conn.send_request(header, data, (out_w, err_w, *extra_fds))
                except OSError as exc:
                    state["error"] = f"cannot send the code to the sandbox: {exc}"
                finally:
                    os.close(out_w)
                    os.close(err_w)
                    out_w = err_w = -1
                if state["error"] is None:
                    await _read_events(tree, state, session)
                    if not session and state["status"] is not None:
                        await tree.wait_code_gone()
            timed_out = scope.cancelled_caught
            wall_s = time.monotonic() - started_at
            ended = True
            status = state["status"]
            if tree.reusable and not timed_out and state["error"] is None and status is not None and os.WIFEXITED(status):
                # U exited by itself after killing the rest of the tree: the server resets the
                # init once this side has closed the channel (see Tree.reusable).
                tree.keep_init = True
            elif state["done"] is None:
                # The tree is finished or must go: SIGKILL its init (the whole PID namespace).
                # After a normal exit nothing can run any more (every process left has a pending
                # SIGKILL), so only an abnormal end waits for the namespace to be gone.
                tree.kill()
                if timed_out or state["status"] is None:
                    with anyio.move_on_after(_KILL_WAIT_S, shield=True) as kill_scope:
                        await tree.wait_dead()
                    if kill_scope.cancelled_caught:
                        state["error"] = state["error"] or "a killed sandbox tree did not exit"
                    elif state["status"] is None and not timed_out and not tree.conn.eof:
                        with anyio.move_on_after(1.0, shield=True):  # the server's exit report
                            await _read_events(tree, state, session)
            tg.cancel_scope.deadline = anyio.current_time() + DRAIN_GRACE_S
    finally:
        if not ended:  # cancelled from outside: nothing of the tree may survive the caller
            tree.kill()
        for fd in (out_w, err_w, out_r, err_r):
            if fd >= 0:
                os.close(fd)
    local = tree.local_status()
    if state["done"] is not None:
        returncode = int(state["done"])
    elif state["status"] is not None:
        returncode = os.waitstatus_to_exitcode(int(state["status"]))
    elif local is not None and not timed_out:
        returncode = local
    else:
        returncode = -signal.SIGKILL
    error = state["error"]
    if error is None and not timed_out and state["done"] is None and state["status"] is None:
        if local is None:
            error = "the sandbox worker died during the execution (no exit status was reported)"
    raw = Raw(out, err, returncode, timed_out, bool(state["started"]), wall_s)
    return Outcome(raw=raw, state_lost=state["done"] is None, error=error)


async def _read_events(tree: Tree, state: dict[str, Any], session: bool) -> None:
    """Read events until the request has ended (``done``/``exit``), an error, or end of stream."""
    while True:
        msg = await tree.conn.recv()
        if msg is None:
            return
        event = msg.get("event")
        if event == "started":
            state["started"] = True
        elif event == "exit":
            try:
                state["status"] = int(msg.get("status", 0))
            except (TypeError, ValueError):
                continue
            return
        elif event == "done" and session and state["started"]:
            try:
                state["done"] = int(msg.get("exit_code", 1)) & 0xFF
            except (TypeError, ValueError):
                continue
            return
        elif event == "error" and not state["started"]:  # before the code ran: trusted
            state["error"] = str(msg.get("message", "unknown error"))[:2000]
            return
