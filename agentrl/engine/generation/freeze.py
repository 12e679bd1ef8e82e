"""A CPU engine's processes stopped while the learner trains (colocated on CPUs).

vLLM-CPU has no sleep mode, and its engine processes do not idle: between batches the engine core
polls its input queue, holding a core. Colocated, generation and training take turns with every
core, so while the learner trains the engine's processes are stopped with ``SIGSTOP`` (they hold
their memory and their state, and use no CPU) and continued with ``SIGCONT`` before the engine is
used again: nothing in vLLM changes, and a message sent to a stopped process waits in its queue.

The processes are every descendant of the generator's own process (the one that holds the
``AsyncLLM`` front end, which is never stopped: it answers the run's calls). A process that exits
meanwhile is skipped. If the generator's process dies while they are stopped, Ray kills its
children (``SIGKILL`` ends a stopped process too).
"""

from __future__ import annotations

import os
import signal

__all__ = ["engine_processes", "freeze", "thaw"]


def engine_processes(root_pid: int | None = None) -> list[int]:
    """The pids of every descendant of ``root_pid`` (default: this process): a vLLM engine's
    core and worker processes when called in the generator's process."""
    import psutil

    try:
        return [p.pid for p in psutil.Process(root_pid or os.getpid()).children(recursive=True)]
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
