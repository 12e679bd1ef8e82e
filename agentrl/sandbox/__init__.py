"""Sandboxes that execute model-written Python, and their threat model.

Use :func:`create_sandbox` and ``await sandbox.run(code)``, which returns an :class:`ExecResult`;
``async with sandbox.session() as s: await s.run(...)`` keeps an interpreter's state across calls
within one episode (:class:`SandboxSession`). Code that raises, hangs or exhausts memory is an
ordinary result; only a broken sandbox raises :class:`agentrl.errors.SandboxError` (an
infrastructure failure: the episode is kept out of the loss, never scored as a wrong answer).

Backends (``kind`` of :func:`create_sandbox`):

* ``"bubblewrap"`` (:class:`BubblewrapSandbox`, the default): Linux namespaces with bubblewrap.
  ``warm=True`` (default): warm fork-server workers with numpy and sympy already imported; an
  execution costs a few milliseconds (no interpreter start, no imports). ``warm=False``: one
  ``bwrap`` container and fresh interpreter per execution (~30 ms plus imports).
* ``"docker"`` (:class:`~agentrl.sandbox.docker.DockerSandbox`): a pool of locked-down containers
  on a local Docker engine, one ``docker exec`` per execution (~100 ms plus imports).
* ``"unsafe-local"`` (:class:`UnsafeLocalSandbox`): a plain subprocess with rlimits and a clean
  environment and NO isolation, to debug on machines without bubblewrap or Docker.

Threat model
------------
The adversary is the code itself: written by a model that may have learned to game its reward or
to damage the host, and run millions of times. Each property below is attacked by a test in
``tests/sandbox/test_threat_model.py`` on every backend for which it is claimed (``bwrap``: both
bubblewrap modes; ``docker``; ``local``: unsafe-local). After each attack the test also checks that
the result says what happened, that no process of the attack is left on the host, and that the
sandbox keeps working.

Covered:

* **Fork bomb** (bwrap, docker; ``test_fork_bomb``). A process limit per execution:
  ``RLIMIT_NPROC`` counted in a user namespace of the execution's own (bwrap), the container's PID
  cgroup limit (docker); the deadline then kills the whole tree.
* **Memory bomb** (all; ``test_memory_bomb``). ``RLIMIT_AS`` per process: ``memory_mb`` on top of
  the address space the interpreter holds when it is handed the code, on every backend and in every
  mode (a fresh interpreter holds about 10 MB, a warm one with numpy and sympy about 200 MB; one
  implementation, ``agentrl.sandbox.guest.limits.apply_limits``): allocations fail with
  ``MemoryError`` and ``memory_exceeded`` is set. A process killed by SIGKILL the sandbox did not
  send also counts as memory exceeded.
* **Resources spread over many processes** (bwrap, docker; ``tests/sandbox/test_cgroups.py``:
  ``test_a_memory_bomb_spread_over_processes_is_bounded_as_a_whole``, the same in a session,
  ``test_cpu_spread_over_processes_is_bounded_as_a_whole``). The whole process tree of an execution
  is in a cgroup of its own (bwrap: :mod:`agentrl.sandbox._cgroups`, v1 or delegated v2, where the
  host lets the engine create cgroups, else rlimits only and ``agentrl check --dry-run`` says so;
  docker: the container's): memory without swap (bwrap: ``memory_mb`` plus what copy-on-write may
  copy of the warm interpreter; docker: ``container_memory_mb``), processes and threads
  (``max_processes``), CPU (``cpus`` cores). Going over memory OOM-kills a process of the tree and
  sets ``memory_exceeded`` (bwrap); CPU is throttled.
* **Infinite loop; sleeping past the deadline** (all; ``test_infinite_loop``,
  ``test_sleeping_past_the_deadline``). A wall-clock deadline per execution (``timeout_s``), plus
  ``RLIMIT_CPU`` just above it; output written before the deadline is kept, ``timed_out`` is set.
* **Forging the end of its own execution** (all; ``test_forged_end_of_execution``). Code that
  writes "I exited" on every socket it can reach and goes on running is still killed at its
  deadline: the warm bubblewrap host takes an ``exit`` report from the code's channel only once
  the code's process is really gone (a pidfd of it from the server), the Docker runner and the
  one-shot modes report ends they observed themselves.
* **Busy children outliving the parent** (bwrap, docker; ``test_busy_children_outliving_the_parent``).
  Every execution has a PID namespace (bwrap) or container (docker) of its own; when the code's
  main process ends, everything else in it is SIGKILLed (daemons, new sessions included) before
  the result is returned.
* **A process ignoring SIGTERM** (all; ``test_process_ignoring_sigterm``). The sandbox only ever
  sends SIGKILL: to the execution's PID namespace (bwrap), every process of the container but its
  init (docker), the process group (local).
* **One execution's damage charged to another** (bwrap, docker; ``tests/sandbox/test_blast_radius.py``).
  Code that kills every process it can signal (its process group, its parent, ``kill(-1)``),
  wipes its ``/tmp`` or shuts its own channel down fails at most itself: the next 200 executions
  on the same pool succeed. A warm tree is handed the code only when its processes are alive; a
  try that fails before the code started (a dead worker, tree or container) is made again on a
  fresh one, at most three tries (``PoolStats.start_retries``, ``DockerSandbox.start_retries``).
* **Network** (bwrap, docker; ``test_network_connect``): no network at all, only a loopback
  interface of the execution's own (bwrap: the worker's, or the session's own; docker: the
  container's) - no route to the internet, the host's loopback services or other executions.
* **The host's secrets** (``test_reading_host_environment``: all; ``test_reading_host_files``:
  bwrap, docker). No host environment variable reaches the code (only ``PATH``, ``HOME``,
  ``LANG``, ``PYTHONDONTWRITEBYTECODE``, and ``TMPDIR`` for local); no host process is visible
  (PID namespace); the filesystem is an empty root with read-only binds of only what the
  interpreter needs (``/usr``, the ``/bin``, ``/lib``, ``/lib64`` links, ``/etc/alternatives``,
  ``/etc/ld.so.cache``, the interpreter's prefix, the configured site-packages at ``/opt/site/<i>``):
  home directories, the repository, credentials, ``/etc`` at large and the host's sockets (the
  Docker socket included) are not there at all.
* **Writing outside the private tmp** (bwrap, docker; ``test_writing_outside_private_tmp``). The root
  and every bind are read-only; ``/tmp`` (the working directory and ``HOME``) is a size-capped
  tmpfs of the execution's own; ``RLIMIT_FSIZE`` caps single files.
* **Gigantic output** (all; ``test_gigantic_output``). Each stream is read concurrently and cut to
  ``max_output_bytes`` (``stdout_truncated``/``stderr_truncated``); the rest is read and dropped, so
  the code never blocks on a full pipe and the engine's memory stays bounded.
* **Deleting or replacing the worker's own files** (bwrap, docker;
  ``test_deleting_or_replacing_the_workers_files``). The interpreter, its libraries and the
  preloaded packages are read-only binds; the warm server's code is passed on its command line or
  compiled in a read-only file of the server's own ``/tmp``, which the executions' fresh tmpfs
  covers; each execution is a fresh fork, so even changes in memory (``sympy.solve = None``) die
  with it. It is forked by the server's fork helper, which holds none of the server's descriptors
  (no other tree's channel, no control socket).
  A worker or container that dies anyway is replaced (``tests/sandbox/test_warm.py``,
  ``tests/sandbox/test_docker.py``).
* **State leaking between executions and between sessions** (bwrap, docker;
  ``test_no_state_between_executions``, ``test_no_state_between_sessions``). bwrap: every
  execution runs in PID, mount and IPC namespaces no other execution is using, and every session
  in fresh ones plus a network namespace of its own. A one-shot execution's tree is reused by a
  later one only after its code's process exited by itself (having killed the rest), the host
  has let go of it, and the tree's init has SIGKILLed and reaped every other process of the
  namespace, mounted empty tmpfs on ``/tmp`` and ``/dev/shm`` and moved to a new IPC namespace
  (System V objects and POSIX message queues die with the old one); a timeout, a crash or a
  failed reset ends the tree instead. A tree serves at most 256 executions; docker: one execution or session per container
  at a time, and afterwards every process is killed and ``/tmp``, ``/dev/shm``, ``/dev/mqueue`` and
  System V IPC objects are wiped before the container is reused.
* **Unprivileged identity** (bwrap, docker; ``tests/sandbox/test_bubblewrap.py``,
  ``test_docker.py``): uid/gid 65534 (host uid 65534), no capabilities, ``no_new_privs``, a session
  of its own (no terminal injection).

* **The kernel's most attacked interfaces** (bwrap, per-execution and warm mode and sessions;
  docker; ``tests/sandbox/test_seccomp.py``): the user's code runs under a seccomp filter built
  with libseccomp (:mod:`agentrl.sandbox._seccomp`), complete from before the code's first
  instruction (warm trees: two stacked stages, the second added after the tree's own set-up);
  Docker containers run under the same filter as a seccomp profile instead of Docker's default. It
  is an allowlist (a call libseccomp does not know, e.g. one newer than it, answers ``ENOSYS``, as
  outside Docker's allowlist), and it refuses nested user namespaces and every other new namespace
  (``unshare``, ``clone`` with namespace flags, ``setns``), io_uring, ``bpf``, ``userfaultfd``,
  ``perf_event_open``, keyrings, ``kexec``, module loading, ``ptrace``, ``mount`` and the new mount
  API, address-space ``personality`` flags, everything Docker's default profile refuses, and
  system calls of foreign architectures.

Not covered:

* **Kernel exploits through what remains.** The code still shares the host kernel, through the
  system calls the filter allows; a bug there can give it the host. Use a VM (gVisor,
  Firecracker) where that matters.
* **Side channels** (timing, caches, Spectre-class speculation) and covert channels between
  concurrent executions or with the host (CPU load, memory pressure, the page cache).
* **Resource fairness beyond the limits.** Where bwrap cannot create cgroups (not root, cgroup v2
  without delegation), memory is limited per process only (a program may fork up to
  ``max_processes`` processes of ``memory_mb`` each) and CPU is shared with the host and other
  executions. With cgroups, page cache the code causes is charged to its tree but reclaimable,
  tmpfs pages count against the tree, disk I/O is not metered, and the cgroup's CPU bound is
  bandwidth (throttling), not a share of a dedicated core. Docker's cgroup limits are per
  container.
* **What is readable.** Everything under the bound paths (``/usr``, the interpreter prefix, the
  site-packages directories) is readable: do not keep secrets there.
* **Process ids in a reused tree** continue from those of the executions before, so code can
  tell roughly how many processes earlier executions in its tree started (a covert count).
* **Determinism and secrecy of the warm state.** Warm executions are forks of one interpreter:
  they share its hash seed (``hash()`` of a string is the same in every execution of a worker) and
  anything the warm-up computed; ``random`` and numpy's global generator are reseeded per execution.
* **Bugs in bubblewrap, Docker, runc** and in the host's configuration (e.g. a world-writable bound
  path). In Docker the runner that supervises an execution is uid 0 of the container with
  ``CAP_SETUID``, ``CAP_SETGID`` and ``CAP_KILL`` only (the code cannot signal or trace it); the
  containers need a local engine, whose socket is never exposed to them.
* **Concurrent executions within one Docker session** are not supported; a session holds its
  container and one concurrency slot until it is closed.
* **The result's honesty.** The code controls its own stdout/stderr/exit status (and, in a session
  or a warm execution, can write to its own control channel: all it can do there is misreport or end
  its own execution); verifiers must not trust results beyond what they check.

:class:`UnsafeLocalSandbox` covers only the rlimits (memory, CPU, file size; not the process count
under root), the clean environment, the deadline, output caps and the process-group kill: the code
runs as the calling user, sees and can modify every file that user can, can use the network and
escape its process group. It is for debugging only.
"""

from __future__ import annotations

import importlib
from typing import Any

from agentrl.errors import ConfigError
from agentrl.sandbox.base import (
    ExecResult,
    Sandbox,
    SandboxSession,
    SessionSandbox,
    supports_sessions,
)
from agentrl.sandbox._cgroups import describe as describe_cgroups
from agentrl.sandbox._seccomp import describe as describe_seccomp
from agentrl.sandbox.bubblewrap import BubblewrapSandbox, BubblewrapSession
from agentrl.sandbox.local import UnsafeLocalSandbox, UnsafeLocalSession

__all__ = [
    "SANDBOX_KINDS",
    "BubblewrapSandbox",
    "BubblewrapSession",
    "DockerSandbox",
    "ExecResult",
    "Sandbox",
    "SandboxSession",
    "SessionSandbox",
    "UnsafeLocalSandbox",
    "UnsafeLocalSession",
    "create_sandbox",
    "describe_cgroups",
    "describe_seccomp",
    "supports_sessions",
]

#: The sandbox kinds :func:`create_sandbox` accepts, and where their classes live.
SANDBOX_KINDS: dict[str, str] = {
    "bubblewrap": "agentrl.sandbox.bubblewrap:BubblewrapSandbox",
    "docker": "agentrl.sandbox.docker:DockerSandbox",
    "unsafe-local": "agentrl.sandbox.local:UnsafeLocalSandbox",
}


def __getattr__(name: str) -> Any:
    if name == "DockerSandbox":  # imported on demand: it talks to a Docker engine
        from agentrl.sandbox.docker import DockerSandbox

        return DockerSandbox
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def create_sandbox(kind: str, **kwargs: Any) -> SessionSandbox:
    """Build the sandbox of the given kind.

    Args:
        kind: ``"bubblewrap"`` (:class:`BubblewrapSandbox`: warm fork-server workers by default,
            ``warm=False`` for one container per execution), ``"docker"``
            (:class:`~agentrl.sandbox.docker.DockerSandbox`: a pool of containers on a local
            Docker engine) or ``"unsafe-local"`` (:class:`UnsafeLocalSandbox`, for debugging only).
        **kwargs: passed to the class. Every kind takes ``max_concurrency``, ``timeout_s``,
            ``memory_mb``, ``max_output_bytes``, ``max_processes`` and ``python``; bubblewrap also
            ``warm``, ``preload``, ``warmup``, ``site_packages``, ``startup_timeout_s``; docker also
            ``site_packages``, ``cpus``, ``container_memory_mb``, ``grace_s``.

    Raises:
        ConfigError: ``kind`` is not one of the kinds above, or an argument is invalid.
        SandboxUnavailable: the backend is not installed or not running here (the message says
            how to install or start it).
        SandboxError: the backend failed to initialise.
    """
    try:
        target = SANDBOX_KINDS[kind]
    except KeyError:
        allowed = ", ".join(repr(k) for k in SANDBOX_KINDS)
        raise ConfigError(f"unknown sandbox kind {kind!r}; expected one of: {allowed}") from None
    module_name, _, class_name = target.partition(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    try:
        sandbox: SessionSandbox = cls(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"sandbox {kind!r}: invalid arguments {sorted(kwargs)}: {exc}") from exc
    return sandbox
