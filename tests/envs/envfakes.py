"""Test helpers for tests/envs: a dataset row and functions run in VerifierPool workers. The
sandbox doubles ship with the package (:mod:`agentrl.sandbox.testing`)."""

from __future__ import annotations

from typing import Any

ROW = {"question": "Compute 347*58+91.", "answer": "20217"}


# --- functions run in VerifierPool workers (module level: the workers import them by name) ---


def pool_echo(value: Any) -> Any:
    return value


def pool_sleep_ignoring_alarm(seconds: float) -> str:
    """Stuck where the worker's SIGALRM cannot reach (as C code would be)."""
    import signal
    import time

    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    time.sleep(seconds)
    return "woke up"


def pool_busy_python(seconds: float) -> str:
    """Pure-Python work that the worker's alarm interrupts."""
    import time

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    return "done"


def pool_crash() -> None:
    import os

    os._exit(3)


def pool_raise() -> None:
    raise ValueError("bad input")
