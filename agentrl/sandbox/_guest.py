"""Code that runs *inside* a sandbox: the one-shot prelude, the warm fork server, the Docker
runner, the session child. The one in-sandbox runtime: every backend and mode sets its limits
with :func:`apply_limits` (whose docstring says what each limit means) and runs the code here.

This file is never imported by the engine: its source text is handed to the sandboxed interpreter
as ``python -I -S -c <source> <mode> <config-json>`` (standard library only, no site-packages
needed, Python >= 3.9; see :mod:`agentrl.sandbox._launch`). Host-side counterparts live in
:mod:`agentrl.sandbox._tree` (bubblewrap, unsafe-local) and :mod:`agentrl.sandbox.docker`.

The one-shot paths (bubblewrap's per-execution mode, unsafe-local ``run``) start a fresh
interpreter per execution; to keep that start fast they run only :func:`oneshot_prelude` and what
it needs (:data:`ONESHOT_NAMES`), cut out of this file, rather than the whole of it.

Modes (``sys.argv[1]``):

``server`` (bubblewrap warm worker; runs as uid 0 of a user namespace of its own with
    ``CAP_SETUID``, ``CAP_SETGID``, ``CAP_SETFCAP``, ``CAP_SYS_ADMIN``, ``CAP_SYS_CHROOT`` and
    ``CAP_NET_ADMIN`` over its own namespaces only)
    First forks ``F``, the *init factory*, while it is still small; then imports the configured
    modules, runs the warm-up code, freezes the heap (``gc.freeze``), forks ``Z``, the *fork
    helper* (:func:`fork_helper`), and answers requests on the control socket (fd from the
    config, ``SOCK_SEQPACKET``, frames):
    ``{"op": "take", "kind": "exec" | "session"}`` -> ``{"event": "tree", "pid": n}`` with two
    descriptors attached: the host's end of the new *tree*'s channel, a pidfd of the tree's
    init and (``exec``) a pidfd of its ``U``. ``exec`` trees are forked ahead of requests
    (``prefork`` of them are kept ready).

    A *tree* is: ``I``, forked by ``F`` (cheap: ``F`` is small), pid 1 of a fresh PID namespace
    with fresh mount and IPC namespaces (and a fresh network namespace, loopback only, for
    sessions), a fresh size-capped tmpfs on ``/tmp`` and ``/dev/shm`` and a ``/proc`` of its own;
    ``I`` reaps orphans and resets the tree on the server's request (:func:`init_main`). And
    ``U``, forked by ``Z`` (a copy of the warm server that does nothing but fork, so that the
    server's own work between forks faults no copy-on-write pages and a ``U`` inherits none of
    its descriptors) into ``I``'s namespaces (``setns``), in a user namespace of its own (so that
    ``RLIMIT_NPROC`` counts the tree's processes only) as uid/gid 65534 with no capabilities,
    under the system-call filter, waiting for its request (:func:`tree_process`). ``U`` runs the
    code, kills every other process of the tree, reports ``{"event": "exit", "status": ...}``
    and exits; ``Z`` reaps it and the server reports its real status too (also when ``U`` died
    without reporting). Then, for an ``exec`` tree whose ``U`` exited by itself, the server waits
    until the host has closed the tree's channel (after which the host never signals that ``I``
    again), asks ``I`` to reset the tree and keeps it for a later ``exec`` tree (at most
    ``MAX_TREE_USES`` executions); otherwise, or if the reset fails, it SIGKILLs ``I``, which
    ends the namespace. The host kills a tree at its deadline by sending SIGKILL to ``I``
    through the pidfd.

``runner`` (Docker: started per execution or per session by ``docker exec`` as uid 0 with only
    ``CAP_SETUID``, ``CAP_SETGID``, ``CAP_KILL``)
    Reads framed requests on stdin, runs each in a child that drops to the sandbox uid, supervises
    it (deadline, output caps), kills every other process of the container afterwards, wipes the
    writable places (``/tmp``, ``/dev/shm``, ``/dev/mqueue``, System V IPC) and writes a framed
    result on stdout. ``mode`` ``oneshot``: one request, then exit; ``session``: cells in one
    interpreter until end of input.

``reaper`` (Docker: the container's PID 1)
    Drops to uid 65534 at once, then reaps orphans; not dumpable, so the code (same uid) cannot
    trace it.

``session`` (unsafe-local sessions)
    The ``U`` session loop alone, on a socket passed in the config, without namespaces.

Wire format: tree channels are ``SOCK_SEQPACKET`` (one JSON object per message, the code in
chunks); the Docker runner's stdio uses frames. A frame is a 4-byte big-endian length and that many bytes of JSON. A
request is a frame ``{"code_len": n, ...limits}`` followed by ``n`` bytes of UTF-8 source; the
descriptors for the code's stdout and stderr travel with the request (``SCM_RIGHTS``) where the
channel is a Unix socket.
"""

import _socket  # socket.socket adds Python-level set-up a tree process does not need
import _signal  # the C module: signal.signal/getsignal wrap every answer in an enum, slowly
import json
import os
import signal
import socket
import struct
import sys

CODE_FILENAME = "main.py"
_HDR = struct.Struct(">I")
MAX_FRAME = 1 << 20

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC = 2, 4, 8
MS_REC, MS_PRIVATE = 0x4000, 0x40000
MNT_DETACH = 2


# --------------------------------------------------------------------------------------------
# channels
# --------------------------------------------------------------------------------------------


def frame(obj):
    data = json.dumps(obj, separators=(",", ":")).encode()
    return _HDR.pack(len(data)) + data


#: Largest piece of code per message on a SOCK_SEQPACKET channel.
CHUNK = 32 * 1024


class Packets:
    """A SOCK_SEQPACKET socket: one JSON object (or raw chunk) per message, fds attached."""

    def __init__(self, sock):
        self.sock = sock

    def send(self, obj, fds=()):
        data = json.dumps(obj, separators=(",", ":")).encode()
        if fds:
            socket.send_fds(self.sock, [data], list(fds))
        else:
            self.sock.send(data)

    def recv_raw(self):
        data, fds, _flags, _addr = socket.recv_fds(self.sock, CHUNK + 4096, 8)
        if not data:
            for fd in fds:
                os.close(fd)
            raise EOFError
        return data, fds

    def recv_request(self):
        """One request: the header (with the stdout/stderr fds attached), then the code in
        chunks; the header's message may carry the start of the code after a newline (a JSON
        header never holds a raw one), all of it when it is short."""
        data, fds = self.recv_raw()
        head, _nl, first = data.partition(b"\n")
        req = json.loads(head)
        parts, size, want = [first], len(first), int(req["code_len"])
        while size < want:
            chunk, extra = self.recv_raw()
            for fd in extra:
                os.close(fd)
            parts.append(chunk)
            size += len(chunk)
        return req, fds, b"".join(parts).decode("utf-8", "surrogatepass")

    def send_request(self, req, code, fds):
        self.send(dict(req, code_len=len(code)), fds=fds)
        for i in range(0, len(code), CHUNK):
            self.sock.sendall(code[i:i + CHUNK])

    def park(self, fd=1000):
        """Move the socket to a high, close-on-exec descriptor, out of the code's way."""
        old = self.sock.fileno()
        if old == fd and not os.get_inheritable(fd):
            return fd
        if old != fd:
            os.dup2(old, fd)
            self.sock.detach()
            os.close(old)
        os.set_inheritable(fd, False)
        self.sock = socket.socket(fileno=fd)
        return fd


class Stream:
    """Length-prefixed JSON frames (plus raw tails) over a pair of pipe fds (the Docker runner)."""

    def __init__(self, rfd, wfd):
        self.rfd = rfd
        self.wfd = wfd
        self.buf = bytearray()

    def read(self, n):
        while len(self.buf) < n:
            data = os.read(self.rfd, 1 << 16)
            if not data:
                raise EOFError
            self.buf += data
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def recv(self):
        (n,) = _HDR.unpack(self.read(4))
        if n > MAX_FRAME:
            raise ValueError("frame too large")
        return json.loads(self.read(n))

    def send(self, obj, tail=b""):
        view = memoryview(frame(obj) + tail)
        while view:
            view = view[os.write(self.wfd, view):]


# --------------------------------------------------------------------------------------------
# running the code (shared by every mode)
# --------------------------------------------------------------------------------------------


def apply_limits(req, session_hard_as=None):
    """Apply the request's limits to this process as rlimits (inherited by everything it starts).

    The only code that sets a sandbox's rlimits, on every backend and in every mode (the one-shot
    prelude, warm trees, sessions, the Docker runner). Each limit has one meaning:

    * ``memory_bytes``: ``RLIMIT_AS`` = this process's address space now (``VmSize``, read just
      before the code is handed over) + ``memory_bytes``. So ``memory_mb`` is what the code may
      *add* to the interpreter it runs in: a fresh ``python -I -S`` holds about 10 MB, a warm
      worker that imported numpy and sympy about 200 MB. Processes the code starts inherit the
      same absolute limit. Sessions (``session_hard_as``): the hard limit is fixed when the
      session starts (its interpreter's ``VmSize`` then + ``session_memory_bytes``), each cell's
      soft limit is ``VmSize`` at the cell's start + its ``memory_bytes``, never above the hard one.
    * ``cpu_s``: ``RLIMIT_CPU`` = CPU seconds this process has used + ``cpu_s`` (hard: one more;
      in a session the hard limit stays open, since the soft one moves with each cell).
    * ``fsize``: ``RLIMIT_FSIZE``, bytes; ``nofile``: ``RLIMIT_NOFILE``; ``nproc``:
      ``RLIMIT_NPROC`` (processes of this uid, counted per user namespace) when non-zero (Docker
      sends 0: the container's PID limit counts instead). ``RLIMIT_CORE`` is always 0.

    A limit is never raised above the hard limit the process already has.
    """
    import resource as R

    mem = vm_size() + int(req["memory_bytes"])
    hard_as = mem if session_hard_as is None else session_hard_as
    cpu = int(sum(os.times()[:2])) + int(req["cpu_s"])
    limits = [
        (R.RLIMIT_CORE, 0, 0),
        (R.RLIMIT_AS, min(mem, hard_as), hard_as),
        (R.RLIMIT_FSIZE, int(req["fsize"]), int(req["fsize"])),
        (R.RLIMIT_NOFILE, int(req["nofile"]), int(req["nofile"])),
    ]
    if session_hard_as is None:
        limits.append((R.RLIMIT_CPU, cpu, cpu + 1))
    else:  # in a session the soft limit moves with each cell; the wall clock is the real bound
        limits.append((R.RLIMIT_CPU, cpu, R.RLIM_INFINITY))
    if req.get("nproc"):
        limits.append((R.RLIMIT_NPROC, int(req["nproc"]), int(req["nproc"])))
    for res, soft, hard in limits:
        _cur_soft, cur_hard = R.getrlimit(res)
        if cur_hard != R.RLIM_INFINITY:
            hard = cur_hard if hard == R.RLIM_INFINITY else min(hard, cur_hard)
            soft = min(soft, hard) if soft != R.RLIM_INFINITY else hard
        R.setrlimit(res, (soft, hard))


STARTED = b'{"event":"started"}'
"""The ``started`` event, encoded once."""

RELEASE = b'{"op":"release"}'
"""The host's last message on an exec tree's channel after a normal end, just before it closes
it: it leaves the tree's init alone, so the server may reset and reuse the tree."""

STREAMS_READY = False
"""True in a warm server's forks: the server made ``sys.stdin/stdout/stderr`` on fds 0/1/2 (as
:func:`install_std_streams` does) after everything that could write to them, so a fork only
points those descriptors at the execution's pipes."""

SECCOMP_INSTALL = None
"""Loads the system-call filter's last stage into the calling process (made by
:func:`prepare_seccomp` from a BPF program of :mod:`agentrl.sandbox._seccomp`, built on the
host); None: no filter (set by :func:`fork_helper`, so that every forked tree inherits it ready
to call)."""


def prepare_seccomp(program):
    """A function that loads the BPF ``program`` as the calling process's seccomp filter, after
    ``PR_SET_NO_NEW_PRIVS``; the filter is inherited by every process the code starts and is never
    removable. The ctypes structures are built here, once, so that a forked tree only makes the two
    ``prctl`` calls. The function raises OSError if the kernel refuses the filter (the execution
    then fails as a sandbox error, it does not run unfiltered)."""
    import ctypes

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    buf = ctypes.create_string_buffer(bytes(program), len(program))
    prog = SockFprog(len(program) // 8, ctypes.cast(buf, ctypes.c_void_p))
    ref = ctypes.byref(prog)

    def install(_keep=(buf, prog)):
        if prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        if prctl(22, 2, ref, 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")

    return install


def join_cgroups(fds):
    """Move this process into the cgroups whose ``cgroup.procs`` the host opened for writing and
    passed as ``fds`` (see :mod:`agentrl.sandbox._cgroups`: the kernel checks the opener's
    credentials, so no privilege is needed here), then close them. Everything this process starts
    afterwards is in them too. Raises OSError if the kernel refuses (a sandbox error: the code
    does not run unbounded)."""
    for fd in fds:
        try:
            os.write(fd, b"0")
        finally:
            os.close(fd)


def status_bytes(field):
    """A size from this process's /proc/self/status in bytes (``field``: ``b"VmSize:"``,
    ``b"RssAnon:"``...; 0 if unreadable)."""
    try:
        fd = os.open("/proc/self/status", os.O_RDONLY)
        try:
            data = os.read(fd, 1 << 16)
        finally:
            os.close(fd)
        at = data.find(b"\n" + field)
        if at >= 0:
            return int(data[at + 1 + len(field):data.index(b"\n", at + 1)].split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def vm_size():
    """This process's address-space size in bytes (VmSize)."""
    return status_bytes(b"VmSize:")


def rss_anon():
    """This process's resident anonymous memory in bytes (RssAnon)."""
    return status_bytes(b"RssAnon:")


def drop_privileges(uid):
    """Become ``uid``/``uid`` with no supplementary groups (and so no capabilities), or raise."""
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    if (os.getuid(), os.geteuid(), os.getgid(), os.getegid()) != (uid, uid, uid, uid):
        raise OSError("could not drop privileges to uid %d" % uid)


def oneshot_prelude():
    """The one-shot bootstrap (bubblewrap's per-execution mode, unsafe-local ``run``): set the
    process up, then return the code object of the user's code, which the caller runs as
    ``__main__`` with ``exec`` at module level (so the interpreter itself reports an uncaught
    exception, runs ``atexit`` handlers and joins threads, as for any script).

    Not a mode of this program: for a fast start the host runs only this function and the few
    it needs (:data:`ONESHOT_NAMES`, cut out of this file) as ``python -I -S -c <them>
    <marker_fd> <uid> <cpu_s> <memory_bytes> <fsize> <nofile> <nproc> [<sys.path entries,
    colon-separated>]``, with the code on stdin (a uid of -1: keep the identity). In bubblewrap,
    bwrap has installed the system-call filter before this interpreter started (``--seccomp``).

    Order matters: drop privileges, apply the limits (:func:`apply_limits`), *then* write the
    marker byte (proof that setup finished and the user's code is about to run, so anything after
    it is the code's doing), close every inherited descriptor, read the code from stdin, save a
    copy as ``./main.py`` (for source lines in tracebacks), clear this bootstrap's names from
    ``__main__``, and hide its frames from tracebacks.
    """
    fd, uid, cpu, mem, fsize, nofile, nproc = (int(a) for a in sys.argv[1:8])
    if len(sys.argv) > 9 and sys.argv[9]:
        join_cgroups([int(a) for a in sys.argv[9].split(",")])
    if uid >= 0:
        drop_privileges(uid)
    apply_limits({"cpu_s": cpu, "memory_bytes": mem, "fsize": fsize, "nofile": nofile, "nproc": nproc})
    if len(sys.argv) > 8 and sys.argv[8]:
        sys.path.extend(sys.argv[8].split(":"))
    os.write(fd, b"1")
    for name in os.listdir("/proc/self/fd"):
        if int(name) > 2:
            try:
                os.close(int(name))
            except OSError:
                pass
    text = sys.stdin.buffer.read().decode("utf-8", "surrogatepass")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    filename = CODE_FILENAME
    try:  # a copy on disk, so that tracebacks and inspect can show source lines
        with open(filename, "w", encoding="utf-8", errors="surrogatepass") as f:
            f.write(text)
    except (OSError, ValueError):
        pass

    def excepthook(t, v, tb, _hook=sys.excepthook):
        while tb is not None and tb.tb_frame.f_code.co_filename == "<string>":
            tb = tb.tb_next
        if isinstance(v, BaseException):
            v.__traceback__ = tb
        _hook(t, v, tb)

    sys.excepthook = excepthook
    import builtins

    builtins.exit = builtins.quit = _exit_builtin
    sys.argv = [filename]
    sys.stdout.reconfigure(line_buffering=True)
    g = sys.modules["__main__"].__dict__
    for name in [n for n in g if not n.startswith("__")]:  # this bootstrap's own names
        del g[name]
    g["__file__"] = filename
    return compile(text, filename, "exec", dont_inherit=True)


#: What :func:`oneshot_prelude` needs of this file (the host cuts these out and runs them alone).
ONESHOT_NAMES = (
    "CODE_FILENAME", "join_cgroups", "status_bytes", "vm_size", "apply_limits", "drop_privileges", "_exit_builtin",
    "oneshot_prelude",
)


def reset_process(env, environ=True):
    """Make a forked interpreter look like a fresh one to the code (environment, signals, rng).

    Each step is skipped when the process is already that way (a warm server sets itself up so
    once, and its forks then touch fewer pages: every page a fork writes is a copy-on-write fault).
    ``environ`` False: the environment is known to be ``env`` already (comparing it walks
    ``os.environ`` in Python, which costs a fork more than anything else here).
    """
    if environ and dict(os.environ) != env:
        os.environ.clear()
        os.environ.update(env)
    _signal.set_wakeup_fd(-1)
    for sig in (_signal.SIGCHLD, _signal.SIGTERM, _signal.SIGHUP, _signal.SIGUSR1, _signal.SIGUSR2):
        if _signal.getsignal(sig) != _signal.SIG_DFL:
            _signal.signal(sig, _signal.SIG_DFL)
    if _signal.getsignal(_signal.SIGINT) is not _signal.default_int_handler:
        _signal.signal(_signal.SIGINT, _signal.default_int_handler)
    if _signal.getsignal(_signal.SIGPIPE) != _signal.SIG_IGN:
        _signal.signal(_signal.SIGPIPE, _signal.SIG_IGN)
    if _signal.pthread_sigmask(_signal.SIG_BLOCK, ()):
        _signal.pthread_sigmask(_signal.SIG_SETMASK, ())
    np = sys.modules.get("numpy")
    if np is not None:  # the legacy global RandomState is not reseeded on fork
        try:
            np.random.seed(int.from_bytes(os.urandom(4), "little"))
        except Exception:
            pass
    import atexit

    atexit._clear()


def close_fds_above(n, keep=()):
    """Close every descriptor above ``n`` but those in ``keep`` (``close_range`` where the kernel
    has it: no listing of /proc/self/fd)."""
    low = n + 1
    for fd in sorted(keep):
        if fd >= low:
            os.closerange(low, fd)
            low = fd + 1
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]  # above the soft limit: opened before it was lowered
    os.closerange(low, hard if 0 < hard < 1 << 20 else 1 << 20)


def install_std_streams():
    """Fresh ``sys.stdin/stdout/stderr`` on fds 0/1/2 (line-buffered, like ``python -u`` on a pipe)."""
    import io

    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    sys.stdout = io.TextIOWrapper(
        io.FileIO(1, "w", closefd=False), encoding="utf-8", line_buffering=True
    )
    sys.stderr = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace",
        line_buffering=True,
    )
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr


def point_std_fds(out_fd, err_fd):
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    for fd in {null, out_fd, err_fd} - {0, 1, 2}:
        os.close(fd)


def silence_std_fds():
    """Point fds 1 and 2 at /dev/null: the host sees end-of-file once nothing else holds them."""
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 1)
    os.dup2(null, 2)
    os.close(null)


def _excepthook(t, v, tb):
    # Hide the frames of this file (run as "<string>") from the code's tracebacks; print with the
    # traceback module, which reads the code's source lines from linecache (not from disk).
    import traceback

    while tb is not None and tb.tb_frame.f_code.co_filename == "<string>":
        tb = tb.tb_next
    if isinstance(v, BaseException):
        v.__traceback__ = tb
    traceback.print_exception(t, v, tb, file=sys.stderr)


def _exit_builtin(code=None):
    raise SystemExit(code)


def _exit_status(exc):
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        print(code, file=sys.stderr)
    except Exception:
        pass
    return 1


def new_main_module(filename):
    import builtins
    import types

    mod = types.ModuleType("__main__")
    mod.__file__ = filename
    mod.__builtins__ = builtins
    builtins.exit = builtins.quit = _exit_builtin
    sys.modules["__main__"] = mod
    sys.argv = [filename]
    sys.excepthook = _excepthook
    return mod


def run_cell(text, namespace, filename):
    """Compile and run ``text`` in ``namespace``; return the exit status the code asked for."""
    import linecache

    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    try:
        exec(compile(text, filename, "exec", dont_inherit=True), namespace)
        status = 0
    except SystemExit as exc:
        status = _exit_status(exc)
    except BaseException:
        try:
            sys.excepthook(*sys.exc_info())
        except Exception:
            pass
        status = 1
    return status


def flush_std():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass


def finish_like_interpreter():
    """What the interpreter does before it exits: join threads, run atexit handlers, flush."""
    import atexit

    threading = sys.modules.get("threading")
    if threading is not None:  # not imported: the code started no thread the interpreter would join
        try:
            threading._shutdown()
        except BaseException:
            pass
    try:
        atexit._run_exitfuncs()
    except BaseException:
        pass
    flush_std()


def run_one(chan, env, kill_strategy, environ=True):
    """``U`` of a one-shot tree: run one request and report its end (``started``, ``exit``).

    The channel stays open while the code runs (on a high descriptor): the code could write to it,
    but only ever about its own execution (the host ignores what it cannot parse, and trusts an
    ``error`` only before ``started``).
    """
    reset_process(env, environ)
    fd = chan.park()
    if SECCOMP_INSTALL is not None:  # before the request: this process is forked ahead, so off the latency path
        SECCOMP_INSTALL()
    try:
        req, fds, text = chan.recv_request()
    except EOFError:
        os._exit(0)
    join_cgroups(fds[2:])
    apply_limits(req)
    point_std_fds(fds[0], fds[1])
    close_fds_above(2, keep=(fd,))
    if not STREAMS_READY:
        install_std_streams()
    chan.sock.send(STARTED)
    mod = new_main_module(CODE_FILENAME)
    status = run_cell(text, mod.__dict__, CODE_FILENAME)
    finish_like_interpreter()
    silence_std_fds()
    kill_leftovers(kill_strategy)
    try:
        chan.send({"event": "exit", "status": (status & 0xFF) << 8})
    except OSError:
        pass
    os._exit(status)


def reaped():
    """Reap every child of this process that has exited (never blocks): yields ``(pid, wait
    status)`` of each."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        yield pid, status


def reap_all():
    """Reap every child of this process that has exited (never blocks)."""
    for _ in reaped():
        pass


def kill_leftovers(strategy, wait_s=2.0):
    """Kill every process this one started (or could have), except itself, and wait (up to
    ``wait_s``) until they are gone, reaping its own children.

    ``"all"``: inside a PID namespace or container of our own, everything we may signal (our
    uid). ``"descendants"``: only our descendants (unsafe-local; daemons that re-parented escape).
    """
    import time

    me = os.getpid()
    uid = os.getuid()
    victims = set()
    if strategy == "all":
        try:
            os.kill(-1, signal.SIGKILL)
        except OSError:
            pass
    else:
        children = {}
        for pid, ppid, _uid, _state in _processes():
            children.setdefault(ppid, []).append(pid)
        todo = list(children.get(me, ()))
        while todo:
            pid = todo.pop()
            if pid in victims:
                continue
            victims.add(pid)
            todo.extend(children.get(pid, ()))
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    end = time.monotonic() + wait_s
    if strategy == "all":  # the usual end: nothing but init and this process left in the namespace
        reap_all()
        try:
            if {n for n in os.listdir("/proc") if n.isdigit()} <= {"1", str(me)}:
                return
        except OSError:
            pass
    while True:
        reap_all()
        alive = [
            pid for pid, _ppid, puid, state in _processes()
            if pid not in (me, 1) and state not in ("Z", "X")
            and (pid in victims if strategy != "all" else puid == uid)
        ]
        if not alive or time.monotonic() > end:
            return
        time.sleep(0.001)


def _processes():
    """``(pid, ppid, real uid, state)`` of every process visible in /proc."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            with open("/proc/%s/status" % name, "rb") as f:
                uid = next(int(line.split()[1]) for line in f if line.startswith(b"Uid:"))
        except (OSError, ValueError, IndexError, StopIteration):
            continue
        out.append((int(name), int(fields[1]), uid, fields[0].decode()))
    return out


def session_loop(chan, env, kill_strategy):
    """``U`` of a session tree: run cells in one persistent ``__main__`` namespace until EOF."""
    reset_process(env)
    fd = chan.park()
    close_fds_above(2, keep=(fd,))
    null = os.open(os.devnull, os.O_RDWR)
    for i in (0, 1, 2):
        os.dup2(null, i)
    if null > 2:
        os.close(null)
    install_std_streams()
    if SECCOMP_INSTALL is not None:  # for the session's whole life (filters stack: once)
        SECCOMP_INSTALL()
    mod = new_main_module(CODE_FILENAME)
    namespace = mod.__dict__
    hard_as = None
    n = 0
    while True:
        try:
            req, fds, text = chan.recv_request()
        except EOFError:
            os._exit(0)
        n += 1
        if hard_as is None:
            hard_as = vm_size() + int(req.get("session_memory_bytes") or req["memory_bytes"])
        join_cgroups(fds[2:])  # every cell: the session's cgroup (joining again changes nothing)
        apply_limits(req, session_hard_as=hard_as)
        flush_std()
        point_std_fds(fds[0], fds[1])
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
        chan.send({"event": "started"})
        status = run_cell(text, namespace, "cell%d.py" % n)
        flush_std()
        silence_std_fds()
        kill_leftovers(kill_strategy)
        chan.send({"event": "done", "exit_code": status})


# --------------------------------------------------------------------------------------------
# bubblewrap warm server
# --------------------------------------------------------------------------------------------


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


#: Executions one tree (``I`` and its namespaces) serves at most before it is replaced.
MAX_TREE_USES = 256
#: Reset trees a warm server keeps beyond those it forks ahead (``prefork``), so that a tree
#: coming back while the next is already forked is kept rather than killed.
POOL_SPARE = 2


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
    global SECCOMP_INSTALL
    if setup_filter:
        prepare_seccomp(bytes.fromhex(setup_filter))()
    if lock_filter:
        SECCOMP_INSTALL = prepare_seccomp(bytes.fromhex(lock_filter))
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


def server_main(cfg):
    import gc
    import selectors

    ctl = socket.socket(fileno=int(cfg["control_fd"]))
    sysc = Sys()
    # F first, while this process is small.
    f_srv, f_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    fpid = os.fork()
    if fpid == 0:
        try:
            f_srv.close()
            ctl.close()
            init_factory(sysc, Packets(f_child), cfg)
        finally:
            os._exit(70)
    f_child.close()
    factory = Packets(f_srv)

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
    # Third-party packages the imports brought in (the host routes code that names one here).
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

    # compile() builds the ~120 classes of the ``_ast`` module on its first call in an interpreter
    # (``PyAST_Check``): ~2 ms of CPU, and copy-on-write faults, in every fork that compiles
    # first. Once here, the forks inherit them.
    compile("0", "<warm>", "eval")
    np = sys.modules.get("numpy")
    if np is not None:  # touch the global RandomState once here, not in every fork
        try:
            np.random.seed(int.from_bytes(os.urandom(4), "little"))
        except Exception:
            pass

    reset_process(cfg["env"])  # once here: the forks find it done (the server's own handlers follow)
    global STREAMS_READY
    install_std_streams()  # after the imports and the warm-up, which may have written to the old ones
    STREAMS_READY = True
    rehearse(cfg["env"])
    uid = int(cfg["uid"])
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    os.set_blocking(wake_r, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    gc.collect()
    gc.freeze()
    # Z, the fork helper: every U is forked from it, not from this process. The server's own
    # work between forks (channels, bookkeeping) would otherwise copy-on-write-fault every page it
    # touches after each fork; Z touches a few pages per fork, and its forks hold nothing of the
    # server's (other trees' descriptors, the control socket), so a U has nothing to close.
    helper, z_req = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    notes, z_note = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    zpid = os.fork()
    if zpid == 0:
        try:
            signal.set_wakeup_fd(-1)
            for sock in (ctl, factory.sock, helper, notes):
                sock.close()
            os.close(wake_r)
            os.close(wake_w)
            fork_helper(sysc, z_req, z_note, uid, cfg["env"], cfg.get("seccomp"), cfg.get("seccomp_lock"))
        finally:
            os._exit(70)
    z_req.close()
    z_note.close()
    helper.settimeout(30.0)
    trees = {}  # U pid -> (server's end of the tree channel, the tree's Init, kind)

    depth = max(1, int(cfg.get("prefork", 1)))
    sel = selectors.DefaultSelector()
    pool = []  # inits reset and ready for another exec tree
    releasing = {}  # fd of a finished exec tree's channel -> (channel, init): awaiting the host's close
    resetting = {}  # fd of an init's channel -> init: awaiting its reset answer

    def new_init(kind):
        factory.send({"kind": kind})
        data, fds = factory.recv_raw()
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

    def fork_tree(kind):
        init = pool.pop() if kind == "exec" and pool else new_init(kind)
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
            socket.send_fds(helper, [b"%s %s" % (kind.encode(), b"join" if userns is not None else b"new")], fds)
            answer = helper.recv(600)
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
        trees[upid] = (tree_end, init, kind)
        return upid, host_end, ipidfd, init.uses

    def reap():
        """Reap this server's own children (the init factory, the fork helper): either gone
        means this worker is broken."""
        for pid, _status in reaped():
            if pid in (fpid, zpid):
                os._exit(3)

    def u_exited():
        """The fork helper reaped a ``U``: say how it ended; then end its namespace, or reuse it."""
        try:
            data = notes.recv(64)
        except OSError:
            data = b""
        if not data:
            os._exit(3)  # the fork helper is gone
        pid, status = (int(x) for x in data.split())
        entry = trees.pop(pid, None)
        if entry is None:
            return
        tree_end, init, kind = entry
        try:
            tree_end.send(b'{"event":"exit","status":%d}' % status)
        except OSError:
            pass  # the host closed its end already (it had U's own report), or the code shut it down
        if kind == "exec" and os.WIFEXITED(status) and init.uses + 1 < MAX_TREE_USES:
            releasing[tree_end.fileno()] = [tree_end, init, False]
            sel.register(tree_end, selectors.EVENT_READ, "release")
        else:
            tree_end.close()
            init.kill()

    def released(fd):
        """A finished exec tree's channel: note the host's :data:`RELEASE`, discard what else it
        sent that U never read; at its end, reset the init if the host's last word was
        :data:`RELEASE` (it will not kill that init any more), else kill it.

        The end alone is not enough: the code can shut the channel down (U shares this end's
        socket), and a host that never got the exit report kills the init, maybe only later: a
        tree reset and reused meanwhile would die under a later execution."""
        entry = releasing[fd]
        tree_end, init = entry[0], entry[1]
        try:
            data = tree_end.recv(CHUNK + 4096)
        except OSError:
            data = b""
        if data:
            entry[2] = data == RELEASE
            return
        sel.unregister(tree_end)
        del releasing[fd]
        tree_end.close()
        if not entry[2]:
            init.kill()
            return
        try:
            init.chan.sock.send(b"reset")
        except OSError:
            init.kill()
            return
        resetting[init.chan.sock.fileno()] = init
        sel.register(init.chan.sock, selectors.EVENT_READ, "reset")

    def reset_done(fd):
        init = resetting.pop(fd)
        sel.unregister(init.chan.sock)
        try:
            answer = init.chan.sock.recv(4096)
        except OSError:
            answer = b""
        if answer == b"ok" and len(pool) < depth + POOL_SPARE:
            init.uses += 1
            pool.append(init)
        else:
            init.kill()

    def refill():
        """Fork exec trees ahead until ``depth`` are ready, unless a request is waiting; when
        no reset tree is in the pool but one is on its way back (released or resetting), wait
        for it rather than make a new one (a new tree costs namespaces, mounts and an init)."""
        while len(ready) < depth and (pool or not (releasing or resetting)) and not sel.select(0):
            ready.append(fork_tree("exec"))

    ready = [fork_tree("exec") for _ in range(depth)]
    ctl.send(frame({
        "event": "ready", "loaded": loaded, "skipped": skipped, "modules": modules,
        "anon_bytes": rss_anon(),
    }))
    sel.register(ctl, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    sel.register(notes, selectors.EVENT_READ, "exited")
    while True:
        for key, _ in sel.select():
            if key.data == "exited":
                u_exited()
            elif key.data == "release":
                released(key.fd)
            elif key.data == "reset":
                reset_done(key.fd)
            elif key.fileobj is ctl:
                data = ctl.recv(1 << 16)
                if not data:
                    os._exit(0)
                msg = json.loads(data[4:])
                if msg.get("op") == "take":
                    kind = msg.get("kind", "exec")
                    if kind == "exec":
                        tree = ready.pop(0) if ready else fork_tree("exec")
                    else:
                        tree = fork_tree(kind)
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
                elif msg.get("op") == "ping":
                    ctl.send(frame({"event": "pong"}))
            else:
                try:
                    while os.read(wake_r, 4096):
                        pass
                except BlockingIOError:
                    pass
            reap()
        refill()


# --------------------------------------------------------------------------------------------
# Docker runner
# --------------------------------------------------------------------------------------------


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
    """Docker runner: one process per ``docker exec``; see the module docstring."""

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


# --------------------------------------------------------------------------------------------


def main():
    mode = sys.argv[1]
    cfg = json.loads(sys.argv[2])
    if mode == "server":
        server_main(cfg)
    elif mode == "runner":
        Runner(cfg).serve()
    elif mode == "reaper":
        reaper_main(cfg)
    elif mode == "session":
        os.chdir(cfg["cwd"])
        session_loop(Packets(socket.socket(fileno=int(cfg["fd"]))), cfg["env"], "descendants")
    else:
        raise SystemExit("unknown mode %r" % (mode,))


if __name__ == "__main__":
    main()
