"""Which device a learner rank trains on, and which process-group backend it uses there."""

from __future__ import annotations

from typing import Any

from agentrl.engine.common.devices import local_cuda_index, resolve_device

__all__ = ["assigned_cuda_index", "gather_rows", "join_process_group", "local_cuda_index", "process_group_backend"]


def process_group_backend(on_gpu: bool) -> str:
    """The ``torch.distributed`` backend of the learner's process group.

    On GPU it is device-mapped, ``"cpu:gloo,cuda:nccl"``: FSDP's collectives on CUDA tensors go
    over NCCL, and the few reductions of CPU tensors (the step's statistics) over gloo. A plain
    ``"nccl"`` group raises "No backend type associated with device type cpu" on those. On CPU
    it is ``"gloo"``.
    """
    return "cpu:gloo,cuda:nccl" if on_gpu else "gloo"


def assigned_cuda_index() -> int:
    """The ``torch.cuda`` index this process computes on (0 when it computes on the CPU):
    :func:`~agentrl.engine.common.devices.resolve_device`'s choice."""
    return resolve_device().cuda_index


def join_process_group(rank: int, world_size: int, master_addr: str, master_port: int, timeout_s: float, what: str) -> tuple[str, Any]:
    """Join this process's default ``torch.distributed`` group (``gloo`` on CPU, device-mapped
    NCCL on GPU) and pick the device: ``(backend, torch.device)``. ``what`` names the component
    in the :class:`~agentrl.errors.LearnerError` raised when the rendezvous fails."""
    import datetime

    import torch
    import torch.distributed as dist

    from agentrl.errors import LearnerError

    choice = resolve_device()  # a rank Ray gave no GPU (a CPU critic) trains on the CPU
    on_gpu = choice.on_gpu
    backend = process_group_backend(on_gpu)
    device = torch.device("cuda", choice.cuda_index) if on_gpu else torch.device("cpu")
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
