"""A training rank's states in host memory while vLLM generates (colocated on GPUs).

Colocated, a learner rank and a generator take turns with one GPU. vLLM sleeps while the learner
trains (its weights offloaded, its KV cache dropped); with ``learner.offload_states`` the learner
returns the favour: after a step is published it moves its parameters (FSDP2 shards) and its
AdamW moments to host memory, and the next method that computes brings them back. The device
then holds only vLLM while episodes are generated: 16 bytes a parameter per rank less (float32
master weights, two moments; gradients are already freed), 24 GiB for a 1.5B model on one rank,
at the price of two host-device copies of the same bytes per step (the learner's
``learner_offload_s`` and ``learner_reload_s`` in ``metrics.jsonl``).

This is verl's way for FSDP2 (``module.to(device)`` keeps each ``Parameter`` object, so the
optimizer's references stay valid), with the moments moved in place in the optimizer's state.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["move_states"]


@torch.no_grad()
def move_states(module: torch.nn.Module, optimizer: Any, device: torch.device) -> int:
    """Move ``module``'s parameters and buffers and ``optimizer``'s per-parameter tensors
    (AdamW's ``exp_avg``, ``exp_avg_sq``) to ``device``; AdamW's scalar ``step`` stays where
    torch keeps it (on the host unless ``capturable``). Returns the bytes of optimizer state
    moved. For an FSDP2-sharded ``module`` (the learner's, LoRA's too) the ``Parameter`` objects
    are the same afterwards (``fully_shard``'s ``_apply`` resets its shards in place), so
    ``optimizer`` still updates ``module``.

    The copies are asynchronous: from a GPU to the host, torch puts each copy in page-locked
    memory from its caching host allocator, so the next offload reuses the same pinned blocks
    instead of faulting in fresh pages. One exception: a parameter moved to the host is
    waited for before the next one, because FSDP2 re-pads a shard on the host right after the
    move (``FSDPParam.reset_sharded_param``, for a shard of uneven size) and must read its
    bytes, not a copy still in flight. The caller synchronizes before the optimizer's moved
    states are used or the device memory is counted free."""

    def move(t: torch.Tensor) -> torch.Tensor:
        moved_t = t.to(device, non_blocking=True)
        if device.type == "cpu" and t.is_cuda:
            torch.cuda.current_stream(t.device).synchronize()
        return moved_t

    module._apply(move)  # what Module.to does, with the wait above
    moved = 0
    if optimizer is None:
        return 0
    for state in optimizer.state.values():
        for key, value in state.items():
            if torch.is_tensor(value) and value.dim() > 0:
                state[key] = value.to(device, non_blocking=True)
                moved += value.numel() * value.element_size()
    return moved
