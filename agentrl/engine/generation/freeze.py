"""A CPU engine's processes stopped while the learner trains (colocated on CPUs).

vLLM-CPU has no sleep mode, and its engine processes do not idle: between batches the engine core
polls its input queue, holding a core. Colocated, generation and training take turns with every
core, so while the learner trains the engine's processes are stopped with ``SIGSTOP`` (they hold
their memory and their state, and use no CPU) and continued with ``SIGCONT`` before the engine is
used again: nothing in vLLM changes, and a message sent to a stopped process waits in its queue.

The processes are every descendant of the generator's own process (the one that holds the
``AsyncLLM`` front end, which is never stopped: it answers the run's calls). A process that exits
meanwhile is skipped.

A stopped process cannot notice that its parent died (vLLM's engine watches a pipe from a
thread), and Ray does not kill the children of a worker that was killed. So a generator that
freezes its engine first starts a *sentinel* (:func:`start_sentinel`): a small process in a
session of its own that keeps the list of the generator's descendants and, when the generator's
process is gone, continues them and kills whatever is left after a grace period. Without it a
generator killed mid-step (a crash, the chaos tests' ``SIGKILL``) would leave its engine stopped
for ever, holding its memory.
"""

from __future__ import annotations

import os
import signal

__all__ = ["engine_processes", "freeze", "start_sentinel", "thaw"]

SENTINEL_POLL_S = 1.0
"""How often the sentinel re-reads the generator's descendants and checks that it lives."""
SENTINEL_GRACE_S = 10.0
"""After continuing an orphaned engine, how long the sentinel waits for it to exit by itself
(vLLM's engine exits when its parent's pipe closes) before it kills what is left."""


def engine_processes(root_pid: int | None = None, exclude: set[int] | frozenset[int] = frozenset()) -> list[int]:
    """The pids of every descendant of ``root_pid`` (default: this process) but ``exclude`` (the
    sentinel): a vLLM engine's core and worker processes when called in the generator's process."""
    import psutil

    try:
        return [p.pid for p in psutil.Process(root_pid or os.getpid()).children(recursive=True) if p.pid not in exclude]
    except psutil.NoSuchProcess:
        return []


def _signal(pids: list[int], sig: signal.Signals) -> list[int]:
    """Send ``sig`` to each of ``pids``; the pids that received it (gone ones skipped)."""
    done = []
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            continue
        done.append(pid)
    return done


def freeze(pids: list[int]) -> list[int]:
    """Stop ``pids`` (``SIGSTOP``); returns those stopped, for :func:`thaw`."""
    return _signal(pids, signal.SIGSTOP)


def thaw(pids: list[int]) -> None:
    """Continue ``pids`` (``SIGCONT``); gone ones are skipped."""
    _signal(pids, signal.SIGCONT)


def start_sentinel(watched_pid: int | None = None) -> int:
    """Start the sentinel of ``watched_pid`` (default: this process; see the module docstring) in
    a session of its own; returns its pid. It exits by itself once ``watched_pid`` is gone."""
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-m", "agentrl.engine.generation.freeze", str(watched_pid or os.getpid())],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    return proc.pid


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def watch(watched_pid: int, poll_s: float = SENTINEL_POLL_S, grace_s: float = SENTINEL_GRACE_S) -> None:
    """The sentinel's loop: while ``watched_pid`` lives, remember its descendants (this process
    left out); once it is gone, continue them, wait ``grace_s`` for them to exit and kill the
    rest."""
    import time

    me = {os.getpid()}
    known: list[int] = []
    while _alive(watched_pid):
        known = engine_processes(watched_pid, exclude=me) or known
        time.sleep(poll_s)
    thaw(known)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_alive(p) for p in known):
        time.sleep(0.2)
    _signal([p for p in known if _alive(p)], signal.SIGKILL)


if __name__ == "__main__":
    import sys

    watch(int(sys.argv[1]))
