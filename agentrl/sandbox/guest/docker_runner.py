"""The Docker runner: modes ``runner`` (:class:`Runner`, one per ``docker exec``) and ``reaper``
(:func:`reaper_main`, the container's PID 1) of the guest program; see
:mod:`agentrl.sandbox.guest`. Standard library only."""

import json
import os
import signal
import socket
import sys

from agentrl.sandbox.guest.execution import run_one, session_loop
from agentrl.sandbox.guest.limits import drop_privileges
from agentrl.sandbox.guest.wire import Packets, Stream


class Capture:
    def __init__(self, limit):
        self.limit = limit
        self.data = bytearray()
        self.tail = bytearray()
        self.truncated = False

    def feed(self, chunk):
        room = self.limit - len(self.data)
        if room > 0:
            self.data += chunk[:room]
        if len(chunk) > room:
            self.truncated = True
        self.tail += chunk
        if len(self.tail) > 4096:
            del self.tail[: len(self.tail) - 4096]


def wipe_writable(uid, paths):
    """As the sandbox uid: empty ``paths`` and remove System V IPC objects (a forked helper)."""
    pid = os.fork()
    if pid == 0:
        try:
            drop_privileges(uid)
            import shutil

            def onerror(func, path, _exc):
                try:
                    os.chmod(os.path.dirname(path) or "/", 0o700)
                    os.chmod(path, 0o700)
                    func(path)
                except OSError:
                    pass

            for base in paths:
                try:
                    names = os.listdir(base)
                except OSError:
                    continue
                for name in names:
                    path = os.path.join(base, name)
                    if os.path.isdir(path) and not os.path.islink(path):
                        try:
                            os.chmod(path, 0o700)
                        except OSError:
                            pass
                        shutil.rmtree(path, onerror=onerror)
                    else:
                        try:
                            os.unlink(path)
                        except OSError:
                            pass
            _remove_sysv_ipc()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def _remove_sysv_ipc():
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    IPC_RMID = 0
    for kind, idcol, call in (("shm", 1, "shmctl"), ("sem", 1, "semctl"), ("msg", 1, "msgctl")):
        try:
            with open("/proc/sysvipc/" + kind) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            try:
                ident = int(row.split()[idcol])
            except (IndexError, ValueError):
                continue
            if kind == "sem":
                libc.semctl(ident, 0, IPC_RMID)
            else:
                getattr(libc, call)(ident, IPC_RMID, None)


def _other_processes():
    me = os.getpid()
    return [int(n) for n in os.listdir("/proc") if n.isdigit() and int(n) not in (1, me)]


def kill_everything_else(deadline_s=5.0):
    """Root in the container (CAP_KILL): kill every process but init and ourselves; wait."""
    import time

    end = time.monotonic() + deadline_s
    while True:
        try:
            os.kill(-1, signal.SIGKILL)
        except OSError:
            pass
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
        left = [p for p in _other_processes() if not _is_zombie(p)]
        if not left or time.monotonic() > end:
            return left
        time.sleep(0.002)


def _is_zombie(pid):
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except (OSError, IndexError):
        return True


class Runner:
    """Docker runner: one process per ``docker exec``; see :mod:`agentrl.sandbox.guest`."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.uid = int(cfg["uid"])
        self.host = Stream(0, 1)
        self.session = None  # (pid, Packets) of a session's U
        sys.path.extend(cfg.get("site", []))
        # docker exec may hand us SIGCHLD ignored (children auto-reaped): we need their statuses.
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)

    def serve(self):
        """One-shot: one ``exec`` request, clean up, answer, exit (the container is clean before
        the answer leaves). Session: ``cell`` requests until end of input, then clean up."""
        import time

        oneshot = self.cfg["mode"] == "oneshot"
        while True:
            try:
                req = self.host.recv()
            except EOFError:
                break
            code = self.host.read(int(req.get("code_len", 0)))
            t0 = time.monotonic()
            if oneshot:
                result, out, err = self.exec_one(req, code)
                self.cleanup()
            else:
                result, out, err = self.cell(req, code)
            result["wall_s"] = time.monotonic() - t0
            result["event"] = "result"
            result["out_len"], result["err_len"] = len(out.data), len(err.data)
            result["out_truncated"], result["err_truncated"] = out.truncated, err.truncated
            result["memory_error"] = b"\nMemoryError" in b"\n" + bytes(err.tail)
            self.host.send(result, tail=bytes(out.data) + bytes(err.data))
            if oneshot:
                return
        self.cleanup()

    def cleanup(self):
        left = kill_everything_else()
        wipe_writable(self.uid, self.cfg["wipe"])
        if left:
            sys.stderr.write("agentrl runner: processes left: %r\n" % (left,))

    def _start_child(self, session):
        sock_r, sock_c = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            try:
                sock_r.close()
                os.setsid()
                drop_privileges(self.uid)
                os.chdir("/tmp")
                chan = Packets(sock_c)
                if session:
                    session_loop(chan, self.cfg["env"], "all")
                else:
                    run_one(chan, self.cfg["env"], "all")
            except BaseException as exc:
                try:
                    Packets(sock_c).send({"event": "error", "message": repr(exc)})
                except BaseException:
                    pass
            os._exit(70)
        sock_c.close()
        return pid, Packets(sock_r)

    def exec_one(self, req, code):
        pid, chan = self._start_child(session=False)
        return self._supervise(pid, chan, req, code, session=False)

    def cell(self, req, code):
        if self.session is None:
            self.session = self._start_child(session=True)
        pid, chan = self.session
        result, out, err = self._supervise(pid, chan, req, code, session=True)
        result["state_lost"] = result.pop("child_gone")
        if result["state_lost"]:
            self.session = None
            kill_everything_else()
            chan.sock.close()
        return result, out, err

    def _supervise(self, pid, chan, req, code, session):
        import selectors
        import time

        out, err = Capture(int(req["max_output"])), Capture(int(req["max_output"]))
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        result = {"started": False, "timed_out": False, "status": None, "exit_code": None,
                  "error": None, "child_gone": False}
        try:
            chan.send_request(req, code, [out_w, err_w])
        except OSError as exc:
            result["error"] = "cannot reach the sandbox child: %r" % (exc,)
        os.close(out_w)
        os.close(err_w)
        pidfd = os.pidfd_open(pid)
        sel = selectors.DefaultSelector()
        sel.register(out_r, selectors.EVENT_READ, out)
        sel.register(err_r, selectors.EVENT_READ, err)
        sel.register(chan.sock, selectors.EVENT_READ, "chan")
        sel.register(pidfd, selectors.EVENT_READ, "exit")
        deadline = time.monotonic() + float(req["timeout_s"])
        finished = result["error"] is not None
        drain_until = None
        while True:
            if not finished and time.monotonic() >= deadline:
                result["timed_out"] = True
                finished = True
                kill_everything_else()
            if finished and drain_until is None:
                drain_until = time.monotonic() + 0.5
            streams = [k for k in sel.get_map().values() if isinstance(k.data, Capture)]
            if finished and (not streams or time.monotonic() >= drain_until):
                break
            limit = (drain_until if finished else deadline) - time.monotonic()
            for key, _ in sel.select(max(0.0, limit)):
                if isinstance(key.data, Capture):
                    chunk = os.read(key.fd, 1 << 16)
                    if chunk:
                        key.data.feed(chunk)
                    else:
                        sel.unregister(key.fd)
                        os.close(key.fd)
                elif key.data == "chan":
                    try:
                        data, fds = chan.recv_raw()
                    except (EOFError, OSError):
                        sel.unregister(chan.sock)
                        continue
                    for fd in fds:
                        os.close(fd)
                    try:
                        msg = json.loads(data)
                        event = msg.get("event")
                    except (ValueError, AttributeError):
                        continue  # written by the code: ignore
                    if event == "started":
                        result["started"] = True
                    elif event == "done" and session and result["started"]:
                        result["exit_code"] = int(msg.get("exit_code", 1)) & 0xFF
                        finished = True
                    elif event == "error" and not result["started"]:
                        result["error"] = str(msg.get("message"))[:2000]
                        finished = True
                        kill_everything_else()
                elif key.data == "exit":
                    sel.unregister(pidfd)
                    try:
                        _, status = os.waitpid(pid, 0)
                    except ChildProcessError:
                        status = signal.SIGKILL
                    result["status"] = status
                    result["child_gone"] = True
                    kill_everything_else()
                    finished = True
        for key in list(sel.get_map().values()):
            if isinstance(key.data, Capture):
                os.close(key.fd)
        sel.close()
        os.close(pidfd)
        if result["status"] is None and (result["timed_out"] or result["error"] or not session):
            kill_everything_else()
            try:
                _, status = os.waitpid(pid, 0)
                result["status"] = status
            except ChildProcessError:
                pass
            result["child_gone"] = True
        if not session:
            chan.sock.close()
        return result, out, err


def reaper_main(cfg):
    """PID 1 of a Docker sandbox container: drops to the sandbox uid at once, then only reaps
    orphans; not dumpable, so the code (same uid) cannot trace it."""
    import ctypes

    drop_privileges(int(cfg["uid"]))
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 0
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGCHLD])
    while True:
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            pass
        signal.sigtimedwait([signal.SIGCHLD], 60)


def runner_main(cfg):
    """Mode ``runner``: serve this ``docker exec``'s requests (see :class:`Runner`)."""
    Runner(cfg).serve()
