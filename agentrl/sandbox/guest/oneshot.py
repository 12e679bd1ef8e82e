"""The one-shot bootstrap (bubblewrap's per-execution mode, unsafe-local ``run``): not a mode of
the guest program but the few functions the host cuts out of it and runs alone, for a fast start
(:func:`agentrl.sandbox._launch.oneshot_source`). Standard library only; see
:mod:`agentrl.sandbox.guest`."""

import os
import sys

from agentrl.sandbox.guest.execution import CODE_FILENAME, exit_builtin
from agentrl.sandbox.guest.limits import apply_limits, drop_privileges, join_cgroups


def oneshot_prelude():
    """The one-shot bootstrap (bubblewrap's per-execution mode, unsafe-local ``run``): set the
    process up, then return the code object of the user's code, which the caller runs as
    ``__main__`` with ``exec`` at module level (so the interpreter itself reports an uncaught
    exception, runs ``atexit`` handlers and joins threads, as for any script).

    Not a mode of this program: for a fast start the host runs only this function and the few
    it needs (:data:`ONESHOT_NAMES`, cut out of the guest's files) as ``python -I -S -c <them>
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

    builtins.exit = builtins.quit = exit_builtin
    sys.argv = [filename]
    sys.stdout.reconfigure(line_buffering=True)
    g = sys.modules["__main__"].__dict__
    for name in [n for n in g if not n.startswith("__")]:  # this bootstrap's own names
        del g[name]
    g["__file__"] = filename
    return compile(text, filename, "exec", dont_inherit=True)


#: What :func:`oneshot_prelude` needs of the guest's files (the host cuts these out and runs them
#: alone, in this order).
ONESHOT_NAMES = (
    "CODE_FILENAME", "join_cgroups", "status_bytes", "vm_size", "apply_limits", "drop_privileges", "exit_builtin",
    "oneshot_prelude",
)
