"""Ray at the engine's edge: start and stop the cluster connection, create actors, stop and kill
them, and tell a dead actor from a failing one.

Everything else in the engine holds *handles* and calls ``handle.method.remote(...)``; the fakes
of :mod:`agentrl.engine.testing` answer the same calls in-process, so the loop, the ledger and the
fleet run without Ray in unit tests.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["ACTOR_CPUS_ENV", "ACTOR_LOG_ENV", "RayErrorRoute", "actor_died", "cluster_nodes", "current_node_id", "pin_process", "kill", "new_actor", "redirect_actor_output", "shutdown_all", "start_ray", "stop_ray"]

ACTOR_LOG_ENV = "AGENTRL_ACTOR_LOG"
"""The environment variable that names an actor's log file (set per actor in its runtime env)."""
ACTOR_CPUS_ENV = "AGENTRL_ACTOR_CPUS"
"""The environment variable that pins an actor to CPU cores (comma-separated; set per actor)."""


def redirect_actor_output() -> None:
    """Ray ``worker_process_setup_hook`` of every engine actor: pin the process to the cores named
    by :data:`ACTOR_CPUS_ENV` (:func:`pin_process`), and send its stdout and stderr (file
    descriptors 1 and 2, inherited by vLLM's engine processes) to the file named by
    :data:`ACTOR_LOG_ENV`, appending. Run once when the actor's process starts; without the
    variables it does nothing (the output stays with Ray)."""
    import os
    import sys

    cpus = os.environ.get(ACTOR_CPUS_ENV)
    if cpus:
        pin_process({int(c) for c in cpus.split(",")})
    path = os.environ.get(ACTOR_LOG_ENV)
    if not path:
        return
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def pin_process(cpus: set[int]) -> None:
    """Pin every thread of this process to ``cpus`` (threads and processes started later inherit
    it). Cores this machine does not have are left out; if none is left, nothing is pinned and a
    warning says so."""
    import logging
    import os

    machine = set(range(os.cpu_count() or 1))  # not the inherited affinity: pinning may widen it
    usable = cpus & machine
    if not usable:
        logging.getLogger(__name__).warning(
            "cpu_affinity %s: none of these cores is on this machine (%s); not pinned",
            sorted(cpus), sorted(machine),
        )
        return
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), usable)
        except OSError:  # a thread that just ended
            pass


def start_ray(init_kwargs: dict[str, Any]) -> bool:
    """Connect to (or start) Ray with ``init_kwargs`` unless this process already is; True when
    this call initialised it (the caller then shuts it down with :func:`stop_ray`)."""
    import os
    import sys

    if "address" not in init_kwargs and "ray" not in sys.modules:
        # A local cluster for this user only: token authentication, as Ray now starts local
        # clusters, chosen explicitly (Ray warns only when it has to choose itself). Ray reads the
        # mode when it is imported, so only before that; an explicit RAY_AUTH_MODE of the user's
        # wins, and joining a cluster follows that cluster's setting.
        os.environ.setdefault("RAY_AUTH_MODE", "token")
    import ray

    if ray.is_initialized():
        return False
    ray.init(**init_kwargs)
    return True


class RayErrorRoute:
    """Ray's driver prints every error the cluster publishes (``(raylet) A worker died or was
    killed while executing a task...``) on this process's stdout, beside agentrl's own line for
    the same event. While installed, those messages go to ``sink`` instead (a run's log file:
    nothing is lost); every other Ray output is printed as before. Ray offers no switch for this
    stream, so the route wraps the function its listener thread prints through (looked up at each
    message); :meth:`remove` puts it back. ``routed``: how many messages went to ``sink``."""

    def __init__(self, sink: Callable[[str], None]) -> None:
        import ray._private.worker as ray_worker

        self._module = ray_worker
        self._original = ray_worker.print_to_stdstream
        self.sink = sink
        self.routed = 0

        def print_to_stdstream(data: dict[str, Any], ignore_prefix: bool) -> None:
            if data.get("pid") != "raylet":
                self._original(data, ignore_prefix)
                return
            for line in data.get("lines", []):
                self.routed += 1
                with contextlib.suppress(Exception):  # a failing sink must not kill Ray's listener
                    sink(str(line))

        ray_worker.print_to_stdstream = print_to_stdstream

    def remove(self) -> None:
        """Print Ray's error messages on stdout again."""
        self._module.print_to_stdstream = self._original


def cluster_nodes() -> list[dict[str, Any]]:
    """The cluster's nodes as ``ray.nodes()`` reports them (``Alive``, ``Resources``...)."""
    import ray

    return list(ray.nodes())


def stop_ray() -> None:
    """Disconnect from Ray (and stop the local cluster this process started)."""
    import ray

    ray.shutdown()


def new_actor(cls: type, options: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
    """A Ray actor of ``cls`` with Ray ``options`` (num_cpus, runtime_env...), constructed with
    ``args``/``kwargs``; returns its handle at once (construction runs in the actor)."""
    import ray

    return ray.remote(cls).options(**options).remote(*args, **kwargs)


def kill(handle: Any) -> None:
    """Stop an actor now, without restart (a fake's ``kill()`` for in-process doubles)."""
    if hasattr(handle, "kill") and callable(handle.kill):
        handle.kill()
        return
    import ray

    with contextlib.suppress(Exception):  # already gone
        ray.kill(handle, no_restart=True)


async def shutdown_all(handles: Sequence[Any], timeout: float = 60.0) -> None:
    """Ask each actor to ``shutdown()`` (bounded by ``timeout``), then kill every one."""
    if handles:
        try:
            await asyncio.wait_for(asyncio.gather(*[h.shutdown.remote() for h in handles], return_exceptions=True), timeout)
        except TimeoutError:
            pass
    for h in handles:
        kill(h)


def actor_died(exc: BaseException) -> str | None:
    """When ``exc`` says the actor's process is gone (killed, out of memory, crashed), a short
    description of how it died; None for any other failure (an exception raised by its code, a
    timeout)."""
    from ray.exceptions import RayActorError

    how = getattr(exc, "died_how", None)  # in-process doubles say so themselves (engine.testing)
    if isinstance(how, str):
        return how
    if not isinstance(exc, RayActorError):
        return None
    text = str(exc)
    for needle in ("SIGKILL", "signal", "OOM", "out of memory", "exit code", "exited", "killed", "crash"):
        i = text.find(needle)
        if i >= 0:
            line = text[max(0, text.rfind("\n", 0, i) + 1):].split("\n", 1)[0].strip()
            return line[:300]
    return text.strip().split("\n", 1)[0][:300] or type(exc).__name__


def current_node_id() -> str | None:
    """The Ray node this process runs on (None outside Ray)."""
    try:
        import ray

        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
    except ImportError:  # pragma: no cover
        return None
