"""Sandboxes that execute model-written Python, and their threat model.

Use :func:`create_sandbox` (``"bubblewrap"`` for anything real, ``"unsafe-local"`` only to debug)
and ``await sandbox.run(code)``, which returns an :class:`ExecResult`. Code that raises, hangs or
exhausts memory is an ordinary result; only a broken sandbox raises
:class:`agentrl.errors.SandboxError`.

Threat model (:class:`BubblewrapSandbox`)
-----------------------------------------
The adversary is the code itself: written by a model that may have learned to game its reward or
to damage the host, and run many thousands of times. Each execution is a fresh ``bwrap``
container; nothing persists between executions.

Covered:

* **No network.** A network namespace of its own with only a loopback interface: no route to the
  internet, the host's loopback services, or other executions.
* **Private namespaces.** PID (it sees only its own processes and cannot signal others), IPC, UTS
  (hostname ``sandbox``), mount, cgroup (where available) and user namespaces.
* **A minimal, read-only filesystem.** An empty root that holds only read-only binds of what the
  interpreter needs (``/usr``, the ``/bin``, ``/lib``, ``/lib64`` links, ``/etc/alternatives``,
  ``/etc/ld.so.cache`` and the interpreter's installation prefix), a private ``/proc``, a minimal
  ``/dev`` (``null``, ``zero``, ``full``, ``random``, ``urandom``, ``tty``, a private ``shm``) and
  a private size-capped tmpfs ``/tmp`` (the working directory and ``HOME``), discarded after each
  execution. Home directories, the repository, credentials, ``/etc`` at large and the host's
  sockets are not there at all. Only the standard library is importable (``python -I -S``: no
  site-packages).
* **Clean environment.** No host environment variable reaches the code (only ``PATH``,
  ``HOME=/tmp``, ``LANG=C.UTF-8``, ``PYTHONDONTWRITEBYTECODE=1``), and Python runs in isolated mode
  (``-I``: no ``PYTHON*`` variables, no user site-packages, no current directory on ``sys.path``).
* **Unprivileged identity.** Uid/gid 65534 inside, mapped to host uid 65534 when the engine runs as
  root (otherwise to the caller's uid), no capabilities, ``no_new_privs``, a new session (no
  terminal injection).
* **Resource limits** per process (rlimits): CPU seconds (just above the deadline), address space
  (``memory_mb``: allocations beyond it raise ``MemoryError``), file size, open files, number of
  processes/threads (``max_processes``, counted per execution), no core dumps.
* **Deadline.** At ``timeout_s`` (wall clock) bwrap is SIGKILLed; as PID 1 of the execution's PID
  namespace dies with it, the kernel kills every process the code started, daemons included. The
  same happens when the code's main process exits, and when the engine process dies
  (``--die-with-parent``). Output is capped per stream and read concurrently, so the code cannot
  block on a full pipe or flood the engine's memory.

Not covered:

* **Kernel exploits.** The code shares the host kernel and its full system-call surface (no seccomp
  filter); a kernel bug (in user namespaces, say) can give it the host. Use a VM (gVisor,
  Firecracker) where that matters.
* **Side channels** (timing, caches, Spectre-class speculation) and covert channels between
  concurrent executions, or with the host (CPU load, memory pressure).
* **Resource fairness beyond rlimits.** No cgroups: memory limits are per process (a program may
  fork up to ``max_processes`` processes of ``memory_mb`` each), tmpfs pages count against host
  memory, CPU is shared with the host and other executions, disk and kernel memory are not metered.
* **What is readable.** Everything under the bound paths is readable (``/usr``, the interpreter
  prefix); do not keep secrets there.
* **Bugs in bubblewrap** and in the host's configuration (e.g. a world-writable bound path).
* **The result's honesty.** The code controls its own stdout/stderr/exit status; verifiers must
  not trust them beyond what they check.

:class:`UnsafeLocalSandbox` covers none of the isolation above (only the rlimits, the clean
environment and the process-group kill): it is for debugging on machines without bubblewrap.
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
