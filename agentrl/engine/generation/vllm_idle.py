"""How long vLLM's processes spin after their last message before they sleep.

vLLM's workers read the engine's scheduler output from a shared-memory ring buffer and, after
each read, spin on it (``sched_yield`` in a loop) for ``busy_loop_s`` (1 s in vLLM 0.32) before
they block on a socket (``vllm.distributed.device_communicators.shm_broadcast.SpinCondition``).
On a GPU node that buys latency for free. Where generation and training take turns on the same
CPU cores (colocated placement), it takes one core from the learner for the first second of
every step. :data:`SPIN_ENV` set in a generator's environment replaces that second (``0``: block
at once); :func:`apply_spin_setting` runs in every vLLM process, as part of agentrl's vLLM
plugin (:func:`agentrl.engine.generation.weight_transfer.register`).
"""

from __future__ import annotations

import os

__all__ = ["SPIN_ENV", "apply_spin_setting"]

SPIN_ENV = "AGENTRL_VLLM_SPIN_S"
"""Seconds vLLM's ring-buffer readers spin after a read (unset: vLLM's own default)."""


def apply_spin_setting() -> float | None:
    """Set vLLM's ring-buffer spin time from :data:`SPIN_ENV` in this process; the value set,
    or None when the variable is unset (or vLLM has no such setting: nothing is changed)."""
    raw = os.environ.get(SPIN_ENV)
    if raw is None:
        return None
    seconds = max(0.0, float(raw))
    try:
        from vllm.distributed.device_communicators import shm_broadcast
    except ImportError:  # pragma: no cover - depends on the install
        return None
    cls = getattr(shm_broadcast, "SpinCondition", None)
    init = getattr(cls, "__init__", None)
    if init is None or getattr(init, "_agentrl_spin", None) is not None:
        return seconds if init is not None else None

    def patched(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        kwargs["busy_loop_s"] = seconds
        init(self, *args[:3], **kwargs)

    patched._agentrl_spin = seconds  # type: ignore[attr-defined]
    cls.__init__ = patched
    return seconds
