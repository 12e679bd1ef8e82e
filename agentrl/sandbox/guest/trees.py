"""A warm server's execution trees: each tree's namespaces and its init. The init factory ``F``
(:func:`init_factory`) makes each tree's ``I`` (:func:`init_main`): pid 1 of a fresh PID
namespace with fresh mount and IPC (sessions: network) namespaces and a fresh tmpfs, reset between
executions (:func:`reset_tree`); :class:`Init` is the server's handle on one. The system calls
Python's os module lacks are :class:`Sys`. The fork order and what each process holds are
described in :mod:`agentrl.sandbox.guest`; the server that uses these is
:mod:`agentrl.sandbox.guest.warm`. Part of the guest program (standard library only)."""

import json
import os
import signal
import socket
import struct

from agentrl.sandbox.guest.execution import reap_all
from agentrl.sandbox.guest.wire import Packets

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC = 2, 4, 8
MS_REC, MS_PRIVATE = 0x4000, 0x40000
MNT_DETACH = 2


class Sys:
    """The few system calls Python's os module lacks (ctypes)."""

    def __init__(self):
        import ctypes

        self.ctypes = ctypes
        self.libc = ctypes.CDLL(None, use_errno=True)

    def _check(self, rc, what):
        if rc != 0:
            err = self.ctypes.get_errno()
            raise OSError(err, "%s: %s" % (what, os.strerror(err)))

    def unshare(self, flags):
        self._check(self.libc.unshare(flags), "unshare(%#x)" % flags)

    def setns(self, fd, nstype):
        self._check(self.libc.setns(fd, nstype), "setns(%#x)" % nstype)

    def umount(self, target):
        self._check(self.libc.umount2(target.encode(), MNT_DETACH), "umount %s" % target)

    def mount(self, source, target, fstype, flags, data=None):
        enc = lambda s: None if s is None else s.encode()  # noqa: E731
        self._check(
            self.libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)),
            "mount %s" % target,
        )


def loopback_up():
    import fcntl

    SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s.fileno(), SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


def init_factory(sysc, chan, cfg):
    """``F``: forked by the server before its imports (small, so cheap to fork), it creates the
    ``I`` of each tree on request: pid 1 of a fresh PID namespace, with fresh mount and IPC (and,
    for sessions, network) namespaces, a fresh tmpfs on /tmp and /dev/shm, a /proc of its own.
    The answer carries the server's end of a channel to ``I`` (:func:`init_main`)."""
    own_pidns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    while True:
        try:
            data, _ = chan.recv_raw()
        except EOFError:
            os._exit(0)
        kind = json.loads(data)["kind"]
        reap_all()  # the inits that died since
        ready_r, ready_w = os.pipe()
        srv_end, init_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sysc.setns(own_pidns, CLONE_NEWPID)
        sysc.unshare(CLONE_NEWPID)
        pid = os.fork()
        if pid == 0:
            try:
                os.close(ready_r)
                chan.sock.close()
                srv_end.close()
                flags = CLONE_NEWNS | CLONE_NEWIPC | (CLONE_NEWNET if kind == "session" else 0)
                sysc.unshare(flags)
                sysc.mount(None, "/", None, MS_REC | MS_PRIVATE)
                fresh_tmpfs(sysc, cfg["tmpfs_bytes"], remount=False)
                sysc.mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
                if kind == "session":
                    loopback_up()
                os.write(ready_w, b"1")
                os.close(ready_w)
            except BaseException as exc:
                os.write(ready_w, ("0%r" % (exc,)).encode()[:500])
                os._exit(70)
            init_main(sysc, Packets(init_end), cfg)
        init_end.close()
        os.close(ready_w)
        answer = os.read(ready_r, 600)
        os.close(ready_r)
        if answer == b"1":
            chan.send({"pid": pid}, fds=[srv_end.fileno()])
        else:
            chan.send({"error": answer[1:].decode("utf-8", "replace") or "init died"})
        srv_end.close()


def fresh_tmpfs(sysc, size, remount):
    """Empty, size-capped tmpfs mounts on /tmp and /dev/shm (``remount``: detach the old ones,
    unless nothing was ever created in one: its root directory is its only inode, and the code,
    which is not its owner, cannot have changed that directory)."""
    opts = "size=%d,mode=1777" % size
    for path in ("/tmp", "/dev/shm"):
        if path == "/dev/shm" and not os.path.isdir(path):
            continue
        if remount:
            st = os.statvfs(path)
            if st.f_files and st.f_files - st.f_ffree <= 1:
                continue
            sysc.umount(path)
        sysc.mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, opts)


def init_main(sysc, chan, cfg):
    """``I``: reap orphans until killed; on ``reset`` from the server, make the tree fit for
    another execution and answer ``ok`` (or ``error: <what>``; plain bytes, between two
    processes of the sandbox's own).

    A reset SIGKILLs every other process of the PID namespace and waits (up to ``RESET_WAIT_S``)
    until none is left, then mounts fresh tmpfs on /tmp and /dev/shm and moves ``I`` to a new IPC
    namespace (System V objects and POSIX message queues of the old one die with it). The server
    reuses the tree only after an ``ok``; anything else and it kills ``I``. The end of the channel
    (the server is gone) ends ``I``, and with it the namespace.
    """
    import select

    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    sock = chan.sock.fileno()
    while True:
        try:
            readable = select.select([sock, wake_r], [], [])[0]
        except InterruptedError:
            readable = []
        reap_all()
        if wake_r in readable:
            try:
                while os.read(wake_r, 4096):
                    pass
            except BlockingIOError:
                pass
        if sock not in readable:
            continue
        try:
            data, fds = chan.recv_raw()
        except (EOFError, OSError):
            os._exit(0)
        for fd in fds:
            os.close(fd)
        if data != b"reset":
            continue
        try:
            reset_tree(sysc, cfg)
            answer = b"ok"
        except Exception as exc:
            answer = ("error: %r" % (exc,)).encode("utf-8", "replace")
        try:
            chan.sock.send(answer)
        except OSError:
            os._exit(0)


#: How long a reset waits for the killed processes of a tree to be gone.
RESET_WAIT_S = 2.0


def reset_tree(sysc, cfg):
    """``I``'s reset (see :func:`init_main`); raises if a process outlives ``RESET_WAIT_S``."""
    import time

    try:
        os.kill(-1, signal.SIGKILL)  # pid 1 of the namespace: everything in it but itself
    except ProcessLookupError:
        pass
    end = time.monotonic() + RESET_WAIT_S
    while True:
        reap_all()
        left = [n for n in os.listdir("/proc") if n.isdigit() and n != "1"]
        if not left:
            break
        if time.monotonic() > end:
            raise OSError("processes %s outlived SIGKILL" % ",".join(left[:5]))
        time.sleep(0.001)
    fresh_tmpfs(sysc, cfg["tmpfs_bytes"], remount=True)
    sysc.unshare(CLONE_NEWIPC)


class Init:
    """The server's handle on a tree's ``I``: its pid, a pidfd, the channel for resets, and how
    many executions its tree has served before the current one."""

    def __init__(self, pid, pidfd, chan):
        self.pid = pid
        self.pidfd = pidfd
        self.chan = chan
        self.uses = 0
        self.ns = {}  # namespace name -> fd, opened once (not "ipc": a reset replaces it)
        self.userns = None  # fd of the user namespace of the tree's executions, once one made it

    def namespaces(self, names):
        """Descriptors of ``I``'s namespaces ``names`` (those that never change are cached; the
        caller closes the ``"ipc"`` one)."""
        out = {}
        for name in names:
            if name == "ipc":
                out[name] = os.open("/proc/%d/ns/ipc" % self.pid, os.O_RDONLY | os.O_CLOEXEC)
                continue
            if name not in self.ns:
                self.ns[name] = os.open("/proc/%d/ns/%s" % (self.pid, name), os.O_RDONLY | os.O_CLOEXEC)
            out[name] = self.ns[name]
        return out

    def kill(self):
        """SIGKILL ``I`` (its whole PID namespace) and release the descriptors."""
        try:
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        except OSError:
            pass
        self.close_fds()

    def close_fds(self, keep_pidfd=False):
        for fd in (*self.ns.values(), *(() if self.userns is None else (self.userns,))):
            os.close(fd)
        self.ns = {}
        self.userns = None
        if not keep_pidfd:
            os.close(self.pidfd)
        self.chan.sock.close()
