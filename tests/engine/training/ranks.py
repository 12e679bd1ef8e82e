"""Running a test's torch.distributed ranks as spawned processes (real gloo groups on this machine)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.multiprocessing as mp

from agentrl.engine.training.fsdp_rank import FsdpRank


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


class BareRank(FsdpRank):
    """The smallest FsdpRank: ``module`` is what it trains, ``device`` where it says it computes
    (no process group is joined, nothing is moved there)."""

    def __init__(self, device: str, module: torch.nn.Module, world_size: int = 1) -> None:
        super().__init__(rank=0, world_size=world_size, master_addr="127.0.0.1", master_port=0, model="unused")
        self.device = torch.device(device)
        self.module = module

    def trained_module(self) -> Any:
        return self.module

    def make_batch(self, rows, with_targets):  # pragma: no cover - not used by these tests
        raise NotImplementedError

    def stand_in_row(self):  # pragma: no cover - not used by these tests
        raise NotImplementedError
