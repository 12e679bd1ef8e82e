"""What confines the process that runs the code, on every backend and in every mode: its rlimits
(:func:`apply_limits`, the only code that sets them), its cgroups (:func:`join_cgroups`), its
identity (:func:`drop_privileges`) and the last stage of its system-call filter
(:func:`prepare_seccomp`). Part of the guest program (standard library only; see
:mod:`agentrl.sandbox.guest`)."""

import os


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
