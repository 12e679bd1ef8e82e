"""Running the code, shared by every mode: making a forked interpreter look fresh, pointing its
standard streams at the execution's pipes, running a cell as ``__main__``, finishing like the
interpreter does, and killing what the code left behind. :func:`run_one` is the ``U`` of a
one-shot tree, :func:`session_loop` the ``U`` of a session, :func:`session_main` the
unsafe-local session mode. Part of the guest program (standard library only; see
:mod:`agentrl.sandbox.guest`)."""

import _signal  # the C module: signal.signal/getsignal wrap every answer in an enum, slowly
import os
import signal
import socket
import sys

from agentrl.sandbox.guest.limits import apply_limits, join_cgroups, vm_size
from agentrl.sandbox.guest.wire import STARTED, Packets

CODE_FILENAME = "main.py"

STREAMS_READY = False
"""True in a warm server's forks: the server made ``sys.stdin/stdout/stderr`` on fds 0/1/2 (as
:func:`install_std_streams` does) after everything that could write to them, so a fork only
points those descriptors at the execution's pipes."""

SECCOMP_INSTALL = None
"""Loads the system-call filter's last stage into the calling process (made by
:func:`prepare_seccomp` from a BPF program of :mod:`agentrl.sandbox._seccomp`, built on the
host); None: no filter (set by :func:`fork_helper` through :func:`set_seccomp_install`, so that
every forked tree inherits it ready to call)."""


def set_streams_ready():
    """Note that this process (a warm server) has made its standard streams, for its forks
    (:data:`STREAMS_READY`)."""
    global STREAMS_READY
    STREAMS_READY = True


def set_seccomp_install(install):
    """Set :data:`SECCOMP_INSTALL` (the fork helper, before it forks any tree)."""
    global SECCOMP_INSTALL
    SECCOMP_INSTALL = install


def exit_builtin(code=None):
    raise SystemExit(code)


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
    # Hide the frames of the guest program (run as "<string>") from the code's tracebacks; print with the
    # traceback module, which reads the code's source lines from linecache (not from disk).
    import traceback

    while tb is not None and tb.tb_frame.f_code.co_filename == "<string>":
        tb = tb.tb_next
    if isinstance(v, BaseException):
        v.__traceback__ = tb
    traceback.print_exception(t, v, tb, file=sys.stderr)


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
    builtins.exit = builtins.quit = exit_builtin
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


def session_main(cfg):
    """Mode ``session`` (unsafe-local sessions): the session loop alone, on the socket passed in
    ``cfg``, without namespaces."""
    os.chdir(cfg["cwd"])
    session_loop(Packets(socket.socket(fileno=int(cfg["fd"]))), cfg["env"], "descendants")
