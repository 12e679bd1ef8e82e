"""Which device a learner rank trains on, and which process-group backend it uses there."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

__all__ = ["assigned_cuda_index", "gather_rows", "join_process_group", "local_cuda_index", "process_group_backend"]


def process_group_backend(on_gpu: bool) -> str:
    """The ``torch.distributed`` backend of the learner's process group.

    On GPU it is device-mapped, ``"cpu:gloo,cuda:nccl"``: FSDP's collectives on CUDA tensors go
    over NCCL, and the few reductions of CPU tensors (the step's statistics) over gloo. A plain
    ``"nccl"`` group raises "No backend type associated with device type cpu" on those. On CPU
    it is ``"gloo"``.
    """
    return "cpu:gloo,cuda:nccl" if on_gpu else "gloo"


def local_cuda_index(gpu_ids: Sequence[str | int], visible: str | None) -> int:
    """The ``torch.cuda`` index of the first GPU Ray assigned to this process.

    ``gpu_ids`` is ``ray.get_gpu_ids()`` (physical ids; empty outside a Ray task). ``visible`` is
    ``CUDA_VISIBLE_DEVICES``: Ray narrows it to the assigned GPUs by default, and torch numbers
    the visible devices from 0, so the index is the id's position in that list; when Ray was
    told not to set it (``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES``) all GPUs are visible
    and the index is the physical id. 0 without an assignment.
    """
    if not gpu_ids:
        return 0
    first = str(gpu_ids[0])
    if visible:
        listed = [d.strip() for d in visible.split(",")]
        return listed.index(first) if first in listed else 0
    return int(first)


def assigned_cuda_index() -> int:
    """:func:`local_cuda_index` of this process (Ray's assignment, when running under Ray)."""
    try:
        import ray

        gpu_ids = ray.get_gpu_ids() if ray.is_initialized() else []
    except Exception:  # not a Ray worker
        gpu_ids = []
    return local_cuda_index(gpu_ids, os.environ.get("CUDA_VISIBLE_DEVICES"))


def join_process_group(rank: int, world_size: int, master_addr: str, master_port: int, timeout_s: float, what: str) -> tuple[str, Any]:
    """Join this process's default ``torch.distributed`` group (``gloo`` on CPU, device-mapped
    NCCL on GPU) and pick the device: ``(backend, torch.device)``. ``what`` names the component
    in the :class:`~agentrl.errors.LearnerError` raised when the rendezvous fails."""
    import datetime

    import torch
    import torch.distributed as dist

    from agentrl.errors import LearnerError

    on_gpu = torch.cuda.is_available()
    backend = process_group_backend(on_gpu)
    device = torch.device("cuda", assigned_cuda_index()) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)
    try:
        dist.init_process_group(
            backend,
            init_method=f"tcp://{master_addr}:{master_port}",
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
    except Exception as exc:
        raise LearnerError(f"{what} rank {rank}: cannot join the process group: {exc}") from exc
    return backend, device


def gather_rows(mine: dict[int, list[float]], world_size: int) -> dict[int, list[float]]:
    """Every rank's rows merged (a collective when ``world_size > 1``): each rank computed the
    rows of its own micro-batches, by sample index; every rank gets all of them."""
    if world_size > 1:
        import torch.distributed as dist

        parts: list[dict[int, list[float]] | None] = [None] * world_size
        dist.all_gather_object(parts, mine)
        return {i: row for part in parts for i, row in (part or {}).items()}
    return mine
