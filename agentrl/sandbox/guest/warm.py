"""The bubblewrap warm worker: mode ``server`` of the guest program (:class:`WarmServer`), the
fork helper ``Z`` (:func:`fork_helper`) and a tree's ``U`` up to the code
(:func:`tree_process`). Each tree's namespaces and its init ``I`` (made by the init factory
``F``) are :mod:`agentrl.sandbox.guest.trees`. The fork order and what each process holds are
described in :mod:`agentrl.sandbox.guest`. Part of the guest program (standard library only)."""

import _socket  # socket.socket adds Python-level set-up a tree process does not need
import _signal  # the C module: signal.signal/getsignal wrap every answer in an enum, slowly
import json
import os
import signal
import socket
import sys

from agentrl.sandbox.guest.execution import (
    CODE_FILENAME,
    flush_std,
    install_std_streams,
    new_main_module,
    reaped,
    reset_process,
    run_cell,
    run_one,
    session_loop,
    set_seccomp_install,
    set_streams_ready,
)
from agentrl.sandbox.guest.limits import drop_privileges, prepare_seccomp, rss_anon, vm_size
from agentrl.sandbox.guest.trees import CLONE_NEWIPC, CLONE_NEWNET, CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWUSER, Init, Sys, init_factory
from agentrl.sandbox.guest.wire import CHUNK, RELEASE, Packets, frame

#: Executions one tree (``I`` and its namespaces) serves at most before it is replaced.
MAX_TREE_USES = 256
#: Reset trees a warm server keeps beyond those it forks ahead (``prefork``), so that a tree
#: coming back while the next is already forked is kept rather than killed.
POOL_SPARE = 2


#: Where a tree process keeps its channel (out of the code's way; see ``Packets.park``).
CHANNEL_FD = 1000


def fork_helper(sysc, requests, notes, uid, env, setup_filter=None, lock_filter=None):
    """``Z``: forks each tree's ``U`` on the server's request and reports how each ended.

    ``setup_filter`` and ``lock_filter`` (hex BPF programs, or None for no filter): the two
    stages of the system-call filter (:mod:`agentrl.sandbox._seccomp`). ``Z`` loads the first on
    itself, so that every ``U`` inherits it, loaded once; a ``U`` adds the second
    (:data:`SECCOMP_INSTALL`) after its set-up, before it reads a request.

    A request is one message ``b"<kind> <new|join>"`` with descriptors attached: the tree's PID,
    mount and IPC namespaces, the tree's end of its channel, the network namespace (sessions),
    then either the tree's user namespace (``join``) or the two pipes of the user-namespace
    handshake with the server (``new``: this ``U`` makes the tree's user namespace). The answer is
    the new process's pid in decimal, or an error message. Each reaped ``U`` is reported on
    ``notes`` as ``b"<pid> <wait status>"``.
    """
    if setup_filter:
        prepare_seccomp(bytes.fromhex(setup_filter))()
    if lock_filter:
        set_seccomp_install(prepare_seccomp(bytes.fromhex(lock_filter)))
    note_fd = notes.fileno()
    z_fds = (requests.fileno(), note_fd)

    def on_child(*_):
        for pid, status in reaped():
            os.write(note_fd, b"%d %d" % (pid, status))

    signal.signal(signal.SIGCHLD, on_child)
    while True:
        data, fds, _flags, _addr = socket.recv_fds(requests, 64, 8)
        if not data:
            os._exit(0)
        try:
            kind, how = data.decode().split()
            sysc.setns(fds[0], CLONE_NEWPID)
            pid = os.fork()
        except BaseException as exc:
            for fd in fds:
                os.close(fd)
            requests.send(("%r" % (exc,)).encode()[:500] or b"?")
            continue
        if pid == 0:
            tree_process(sysc, kind, how, fds, z_fds, uid, env)
        for fd in fds:
            os.close(fd)
        requests.send(b"%d" % pid)


def tree_process(sysc, kind, how, fds, z_fds, uid, env):
    """``U``, just forked by ``Z`` into the tree's PID namespace (``fds``: see
    :func:`fork_helper`): enter the tree's other namespaces, make or join its user namespace, drop
    to ``uid``, then run one request (``exec``) or a session's cells. Never returns."""
    chan_fd = fds[3]
    try:
        # A session (and process group) of its own. Forked from Z, U would otherwise share the
        # worker's process group with every other tree's U: ``kill(0, SIGKILL)`` (or any
        # signal to "my process group") from the code reaches processes of other trees that the
        # code cannot even see, e.g. the trees forked ahead for the next executions.
        os.setsid()
        _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)
        for fd in z_fds:
            os.close(fd)
        sysc.setns(fds[1], CLONE_NEWNS)
        sysc.setns(fds[2], CLONE_NEWIPC)
        rest = fds[4:]
        if kind == "session":
            sysc.setns(rest.pop(0), CLONE_NEWNET)
        os.chdir("/tmp")
        if how == "new":
            to_u_r, from_u_w = rest
            sysc.unshare(CLONE_NEWUSER)
            os.write(from_u_w, b"u")
            if os.read(to_u_r, 1) != b"m":
                os._exit(71)
        else:  # the tree's own, made and mapped by its first execution
            sysc.setns(rest[0], CLONE_NEWUSER)
        os.dup2(chan_fd, CHANNEL_FD, inheritable=False)
        for fd in fds:
            os.close(fd)
        chan_fd = CHANNEL_FD
        drop_privileges(uid)
        chan = Packets(_socket.socket(fileno=chan_fd))
        if kind == "exec":
            run_one(chan, env, "all", environ=False)  # the server set env before forking Z
        else:
            session_loop(chan, env, "all")
    except BaseException as exc:
        try:
            Packets(socket.socket(fileno=chan_fd)).send({"event": "error", "message": "sandbox setup: %r" % (exc,)})
        except BaseException:
            pass
    os._exit(70)


#: How many times :func:`rehearse` runs the path (CPython 3.11 specializes a function's bytecode
#: after 8 calls).
REHEARSALS = 12


def rehearse(env):
    """Run the harmless parts of a tree process's path in the warm server, :data:`REHEARSALS`
    times, before the fork helper is forked: receiving a request, the environment check, a new
    ``__main__``, compiling and running a cell, and a cell that raises (its traceback printed into
    a buffer).

    CPython 3.11 counts a function's calls before it specializes its bytecode, and writes the
    counters and inline caches into the code object as it runs: a fork that runs a function its
    parent never ran writes those pages, one copy-on-write fault per function and execution. Run
    here, the code objects are settled before any fork."""
    import io
    import linecache

    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    receiver = Packets(_socket.socket(fileno=b.detach()))
    head = json.dumps({
        "code_len": 5, "timeout_s": 1.0, "cpu_s": 1, "memory_bytes": 1, "fsize": 1, "nofile": 1, "nproc": 1,
        "session_memory_bytes": None,
    }, separators=(",", ":")).encode()
    saved = sys.modules["__main__"], sys.argv, sys.excepthook, sys.stderr
    try:
        for _ in range(REHEARSALS):
            null = os.open(os.devnull, os.O_RDONLY)
            try:
                socket.send_fds(a, [head + b"\n" + b"pass\n"], [null, null])
            finally:
                os.close(null)
            _req, fds, text = receiver.recv_request()
            for fd in fds:
                os.close(fd)
            vm_size()
            reset_process(env, environ=False)
            mod = new_main_module(CODE_FILENAME)
            run_cell(text, mod.__dict__, CODE_FILENAME)
            sys.stderr = io.StringIO()
            run_cell("1 / 0\n", mod.__dict__, CODE_FILENAME)
            sys.stderr = saved[3]
            flush_std()
    finally:
        sys.modules["__main__"], sys.argv, sys.excepthook, sys.stderr = saved
        linecache.cache.pop(CODE_FILENAME, None)
        a.close()
        receiver.sock.close()


class WarmServer:
    """Mode ``server``: a warm worker's fork server (see :mod:`agentrl.sandbox.guest`).

    :meth:`run` forks the init factory ``F`` first, while this process is small; then imports the
    configured modules, runs the warm-up code, freezes the heap, forks the fork helper ``Z`` and
    answers the host's requests on the control socket (``cfg["control_fd"]``) until it closes.

    Its state, between requests:

    * ``ready``: exec trees forked ahead (at most ``depth``), each ``(U pid, host's end of the
      tree channel, pidfd of I, executions its tree served before)``;
    * ``trees``: U pid -> (the server's end of the tree channel, the tree's :class:`Init`, kind),
      for every U not yet reaped;
    * ``pool``: inits reset and ready for another exec tree;
    * ``releasing``: fd of a finished exec tree's channel -> ``[channel, init, released]``,
      awaiting the host's close (``released``: the host's last message was :data:`RELEASE`);
    * ``resetting``: fd of an init's channel -> init, awaiting its reset answer.
    """

    def __init__(self, cfg):
        self.cfg = cfg
        self.ctl = socket.socket(fileno=int(cfg["control_fd"]))
        self.sysc = Sys()
        self.uid = int(cfg["uid"])
        self.depth = max(1, int(cfg.get("prefork", 1)))
        self.fpid = self.zpid = None
        self.factory = self.helper = self.notes = self.sel = None
        self.wake_r = None
        self.trees = {}
        self.ready = []
        self.pool = []
        self.releasing = {}
        self.resetting = {}

    def run(self):
        """Start the worker and serve until the host closes the control socket. Never returns."""
        import gc
        import selectors

        ctl, cfg = self.ctl, self.cfg
        self.start_factory()
        loaded, skipped, modules = self.warm_up()
        rehearse(cfg["env"])
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        os.set_blocking(wake_r, False)
        self.wake_r = wake_r
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(wake_w)
        gc.collect()
        gc.freeze()
        self.start_fork_helper(wake_w)
        self.sel = selectors.DefaultSelector()
        self.ready = [self.fork_tree("exec") for _ in range(self.depth)]
        ctl.send(frame({
            "event": "ready", "loaded": loaded, "skipped": skipped, "modules": modules,
            "anon_bytes": rss_anon(),
        }))
        self.serve()

    def start_factory(self):
        """Fork ``F``, the init factory (:func:`init_factory`), while this process is small."""
        f_srv, f_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.fpid = os.fork()
        if self.fpid == 0:
            try:
                f_srv.close()
                self.ctl.close()
                init_factory(self.sysc, Packets(f_child), self.cfg)
            finally:
                os._exit(70)
        f_child.close()
        self.factory = Packets(f_srv)

    def warm_up(self):
        """Import the configured modules, run the warm-up code, and set this process up as every
        fork wants to find it (once here, not in each fork). Returns ``(loaded, skipped,
        modules)``: the configured modules imported and those that failed (not ``strict``), and
        the third-party packages the imports brought in (the host routes code that names one
        here). Exits (status 1, after an ``error`` frame) if an import fails under ``strict`` or
        the warm-up code raises."""
        ctl, cfg = self.ctl, self.cfg
        base_modules = {name.split(".")[0] for name in sys.modules}
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = "1"
        sys.path.extend(cfg["site"])
        sys.dont_write_bytecode = True
        loaded, skipped = [], []
        for name in cfg["preload"]:
            try:
                __import__(name)
                loaded.append(name)
            except Exception as exc:
                if cfg["strict"]:
                    ctl.send(frame({"event": "error", "message": "cannot import %r: %r" % (name, exc)}))
                    os._exit(1)
                skipped.append(name)
        if cfg.get("warmup"):
            try:
                exec(compile(cfg["warmup"], "<warmup>", "exec"), {"__name__": "__warmup__"})
            except Exception as exc:
                ctl.send(frame({"event": "error", "message": "warm-up code failed: %r" % (exc,)}))
                os._exit(1)
        modules = sorted(
            {name.split(".")[0] for name in sys.modules} - base_modules - set(sys.stdlib_module_names)
        )
        # What every execution uses, imported once here rather than in each fork (an import in the
        # child costs milliseconds of CPU, however small the code).
        import atexit  # noqa: F401
        import linecache  # noqa: F401
        import resource  # noqa: F401
        import time  # noqa: F401
        import traceback  # noqa: F401
        import types  # noqa: F401

        # compile() builds the ~120 classes of the ``_ast`` module on its first call in an
        # interpreter (``PyAST_Check``): ~2 ms of CPU, and copy-on-write faults, in every fork that
        # compiles first. Once here, the forks inherit them.
        compile("0", "<warm>", "eval")
        np = sys.modules.get("numpy")
        if np is not None:  # touch the global RandomState once here, not in every fork
            try:
                np.random.seed(int.from_bytes(os.urandom(4), "little"))
            except Exception:
                pass

        reset_process(cfg["env"])  # once here: the forks find it done (the server's own handlers follow)
        install_std_streams()  # after the imports and the warm-up, which may have written to the old ones
        set_streams_ready()
        return loaded, skipped, modules

    def start_fork_helper(self, wake_w):
        """Fork ``Z``, the fork helper (:func:`fork_helper`): every U is forked from it, not from
        this process. The server's own work between forks (channels, bookkeeping) would otherwise
        copy-on-write-fault every page it touches after each fork; Z touches a few pages per
        fork, and its forks hold nothing of the server's (other trees' descriptors, the control
        socket), so a U has nothing to close."""
        cfg = self.cfg
        helper, z_req = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        notes, z_note = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.zpid = os.fork()
        if self.zpid == 0:
            try:
                signal.set_wakeup_fd(-1)
                for sock in (self.ctl, self.factory.sock, helper, notes):
                    sock.close()
                os.close(self.wake_r)
                os.close(wake_w)
                fork_helper(self.sysc, z_req, z_note, self.uid, cfg["env"], cfg.get("seccomp"), cfg.get("seccomp_lock"))
            finally:
                os._exit(70)
        z_req.close()
        z_note.close()
        helper.settimeout(30.0)
        self.helper, self.notes = helper, notes

    def new_init(self, kind):
        """A new tree's ``I``, made by the init factory."""
        self.factory.send({"kind": kind})
        data, fds = self.factory.recv_raw()
        answer = json.loads(data)
        if "error" in answer or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            raise OSError("cannot create the sandbox init: %s" % answer.get("error", "no channel"))
        chan = Packets(socket.socket(fileno=fds[0]))
        try:
            return Init(answer["pid"], os.pidfd_open(answer["pid"]), chan)
        except OSError:
            chan.sock.close()
            raise

    def fork_tree(self, kind):
        """A new tree of ``kind`` (``exec``: on a reset init from the pool if there is one):
        ``(U pid, host's end of the tree channel, pidfd of I, executions its tree served)``."""
        uid = self.uid
        init = self.pool.pop() if kind == "exec" and self.pool else self.new_init(kind)
        ipidfd = init.pidfd
        nsfds = init.namespaces(["pid", "mnt", "ipc"] + (["net"] if kind == "session" else []))
        userns = init.userns  # None: this U makes the tree's user namespace (and the server maps it)
        host_end, tree_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        to_u_r = to_u_w = from_u_r = from_u_w = None
        try:
            fds = [nsfds["pid"], nsfds["mnt"], nsfds["ipc"], tree_end.fileno()]
            if kind == "session":
                fds.append(nsfds["net"])
            if userns is None:
                to_u_r, to_u_w = os.pipe()
                from_u_r, from_u_w = os.pipe()
                fds += [to_u_r, from_u_w]
            else:
                fds.append(userns)
            socket.send_fds(self.helper, [b"%s %s" % (kind.encode(), b"join" if userns is not None else b"new")], fds)
            answer = self.helper.recv(600)
            if not answer.isdigit():
                raise OSError("cannot fork the sandbox process: %s" % (answer.decode("utf-8", "replace") or "the fork helper is gone"))
            upid = int(answer)
        except BaseException:
            os.close(nsfds["ipc"])
            for fd in (to_u_r, to_u_w, from_u_r, from_u_w):
                if fd is not None:
                    os.close(fd)
            host_end.close()
            tree_end.close()
            init.kill()
            raise
        os.close(nsfds["ipc"])
        if userns is None:
            os.close(to_u_r)
            os.close(from_u_w)
            try:
                if os.read(from_u_r, 1) != b"u":
                    detail = ""
                    tree_end.settimeout(1.0)
                    try:
                        detail = tree_end.recv(4096).decode("utf-8", "replace")
                    except OSError:
                        pass
                    raise OSError("the sandbox child failed to set itself up: %s" % (detail,))
                mapping = "0 0 1\n%d %d 1\n" % (uid, uid)
                for name in ("uid_map", "gid_map"):
                    with open("/proc/%d/%s" % (upid, name), "w") as f:
                        f.write(mapping)
                init.userns = os.open("/proc/%d/ns/user" % upid, os.O_RDONLY | os.O_CLOEXEC)
                os.write(to_u_w, b"m")
            except OSError:
                init.kill()
                raise
            finally:
                os.close(to_u_w)
                os.close(from_u_r)
        self.trees[upid] = (tree_end, init, kind)
        return upid, host_end, ipidfd, init.uses

    def reap(self):
        """Reap this server's own children (the init factory, the fork helper): either gone
        means this worker is broken."""
        for pid, _status in reaped():
            if pid in (self.fpid, self.zpid):
                os._exit(3)

    def u_exited(self):
        """The fork helper reaped a ``U``: say how it ended; then end its namespace, or reuse it."""
        import selectors

        try:
            data = self.notes.recv(64)
        except OSError:
            data = b""
        if not data:
            os._exit(3)  # the fork helper is gone
        pid, status = (int(x) for x in data.split())
        entry = self.trees.pop(pid, None)
        if entry is None:
            return
        tree_end, init, kind = entry
        try:
            tree_end.send(b'{"event":"exit","status":%d}' % status)
        except OSError:
            pass  # the host closed its end already (it had U's own report), or the code shut it down
        if kind == "exec" and os.WIFEXITED(status) and init.uses + 1 < MAX_TREE_USES:
            self.releasing[tree_end.fileno()] = [tree_end, init, False]
            self.sel.register(tree_end, selectors.EVENT_READ, "release")
        else:
            tree_end.close()
            init.kill()

    def released(self, fd):
        """A finished exec tree's channel: note the host's :data:`RELEASE`, discard what else it
        sent that U never read; at its end, reset the init if the host's last word was
        :data:`RELEASE` (it will not kill that init any more), else kill it.

        The end alone is not enough: the code can shut the channel down (U shares this end's
        socket), and a host that never got the exit report kills the init, maybe only later: a
        tree reset and reused meanwhile would die under a later execution."""
        import selectors

        entry = self.releasing[fd]
        tree_end, init = entry[0], entry[1]
        try:
            data = tree_end.recv(CHUNK + 4096)
        except OSError:
            data = b""
        if data:
            entry[2] = data == RELEASE
            return
        self.sel.unregister(tree_end)
        del self.releasing[fd]
        tree_end.close()
        if not entry[2]:
            init.kill()
            return
        try:
            init.chan.sock.send(b"reset")
        except OSError:
            init.kill()
            return
        self.resetting[init.chan.sock.fileno()] = init
        self.sel.register(init.chan.sock, selectors.EVENT_READ, "reset")

    def reset_done(self, fd):
        """An init answered its reset: keep it in the pool after an ``ok`` (if there is room),
        else kill it."""
        init = self.resetting.pop(fd)
        self.sel.unregister(init.chan.sock)
        try:
            answer = init.chan.sock.recv(4096)
        except OSError:
            answer = b""
        if answer == b"ok" and len(self.pool) < self.depth + POOL_SPARE:
            init.uses += 1
            self.pool.append(init)
        else:
            init.kill()

    def refill(self):
        """Fork exec trees ahead until ``depth`` are ready, unless a request is waiting; when
        no reset tree is in the pool but one is on its way back (released or resetting), wait
        for it rather than make a new one (a new tree costs namespaces, mounts and an init)."""
        while (
            len(self.ready) < self.depth and (self.pool or not (self.releasing or self.resetting))
            and not self.sel.select(0)
        ):
            self.ready.append(self.fork_tree("exec"))

    def take(self, kind):
        """Hand the host a tree of ``kind``: a ``tree`` frame with the host's end of its channel,
        a pidfd of its ``I`` and (``exec``) a pidfd of its ``U`` attached."""
        ctl = self.ctl
        if kind == "exec":
            tree = self.ready.pop(0) if self.ready else self.fork_tree("exec")
        else:
            tree = self.fork_tree(kind)
        pid, host_end, pidfd, uses = tree
        fds = [host_end.fileno(), pidfd]
        try:
            if kind == "exec":  # the host trusts U's own exit report only once U is gone
                fds.append(os.pidfd_open(pid))
        except OSError:  # U died already: the host sees its end on the channel
            fds.append(os.open("/dev/null", os.O_RDONLY))
        socket.send_fds(ctl, [frame({"event": "tree", "pid": pid, "reused": uses})], fds)
        host_end.close()
        for fd in fds[2:]:
            os.close(fd)

    def serve(self):
        """Answer the host's requests and the trees' ends until the control socket closes."""
        import selectors

        ctl, sel, wake_r = self.ctl, self.sel, self.wake_r
        sel.register(ctl, selectors.EVENT_READ)
        sel.register(wake_r, selectors.EVENT_READ)
        sel.register(self.notes, selectors.EVENT_READ, "exited")
        while True:
            for key, _ in sel.select():
                if key.data == "exited":
                    self.u_exited()
                elif key.data == "release":
                    self.released(key.fd)
                elif key.data == "reset":
                    self.reset_done(key.fd)
                elif key.fileobj is ctl:
                    data = ctl.recv(1 << 16)
                    if not data:
                        os._exit(0)
                    msg = json.loads(data[4:])
                    if msg.get("op") == "take":
                        self.take(msg.get("kind", "exec"))
                    elif msg.get("op") == "ping":
                        ctl.send(frame({"event": "pong"}))
                else:
                    try:
                        while os.read(wake_r, 4096):
                            pass
                    except BlockingIOError:
                        pass
                self.reap()
            self.refill()


def server_main(cfg):
    """Mode ``server``: run a :class:`WarmServer` on ``cfg`` (never returns)."""
    WarmServer(cfg).run()
