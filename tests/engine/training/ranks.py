"""Running a test's torch.distributed ranks as spawned processes (real gloo groups on this machine)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp


def run_ranks(target: Callable[..., Any], args: Callable[[int], tuple[Any, ...]], *, world: int = 2, timeout_s: float = 240) -> None:
    """Run ``target(*args(rank))`` for every rank in a spawned process; wait ``timeout_s`` at most
    for each, kill any still running, and fail the test unless every rank exited with status 0."""
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=target, args=args(rank)) for rank in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=timeout_s)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(timeout=30)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
