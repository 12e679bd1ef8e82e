"""Whether this process computes on a GPU, and on which: the one place the engine decides it.

A Ray actor runs on the GPUs Ray assigned it (``ray.get_gpu_ids()``), and on none when Ray gave
it none, whatever CUDA shows: Ray 2.60 does not empty ``CUDA_VISIBLE_DEVICES`` for an actor with
``num_gpus = 0``, so on a GPU node such an actor sees every GPU, and deciding from
``torch.cuda.is_available()`` alone put it on GPU 0, beside the process Ray gave GPU 0 to. Outside
a Ray actor (a script, the unit tests) CUDA's availability decides.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["DeviceChoice", "decide_device", "local_cuda_index", "ray_actor_gpu_ids", "resolve_device"]


@dataclass(frozen=True)
class DeviceChoice:
    """Where this process computes."""

    on_gpu: bool
    """True: on CUDA device :attr:`cuda_index`; False: on the CPU."""
    cuda_index: int
    """The ``torch.cuda`` index of the first GPU to use (0 when not :attr:`on_gpu`)."""
    cuda_visible: bool
    """``torch.cuda.is_available()`` in this process: True with :attr:`on_gpu` False means CUDA
    is there but Ray gave this actor no GPU (a component that cannot run on the CPU beside a
    visible GPU, vLLM's CUDA build, refuses)."""
    reason: str
    """Why, in words (for errors and logs)."""


def local_cuda_index(gpu_ids: Sequence[str | int], visible: str | None) -> int:
    """The ``torch.cuda`` index of the first GPU Ray assigned to this process.

    ``gpu_ids`` is ``ray.get_gpu_ids()`` (physical ids). ``visible`` is ``CUDA_VISIBLE_DEVICES``:
    Ray narrows it to the assigned GPUs by default, and torch numbers the visible devices from 0,
    so the index is the id's position in that list; when Ray was told not to set it
    (``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES``) all GPUs are visible and the index is the
    physical id. 0 without an assignment.
    """
    if not gpu_ids:
        return 0
    first = str(gpu_ids[0])
    if visible:
        listed = [d.strip() for d in visible.split(",")]
        return listed.index(first) if first in listed else 0
    return int(first)


def decide_device(gpu_ids: Sequence[str | int] | None, visible: str | None, cuda_available: bool) -> DeviceChoice:
    """The decision, from its inputs. ``gpu_ids``: the GPUs Ray assigned this actor (``None``
    outside a Ray actor); ``visible``: ``CUDA_VISIBLE_DEVICES``; ``cuda_available``:
    ``torch.cuda.is_available()``."""
    if gpu_ids is None:
        if cuda_available:
            return DeviceChoice(True, 0, True, "outside Ray, CUDA is available")
        return DeviceChoice(False, 0, False, "outside Ray, CUDA is not available")
    if not gpu_ids:
        why = "Ray gave this actor no GPU (num_gpus = 0)" + (", although CUDA shows GPUs" if cuda_available else "")
        return DeviceChoice(False, 0, cuda_available, why)
    if not cuda_available:
        return DeviceChoice(False, 0, False, f"Ray gave this actor GPU {list(gpu_ids)}, but CUDA is not available (declared GPUs)")
    return DeviceChoice(True, local_cuda_index(gpu_ids, visible), True, f"Ray gave this actor GPU {list(gpu_ids)}")


def ray_actor_gpu_ids() -> list[str] | None:
    """``ray.get_gpu_ids()`` inside a Ray actor, as strings; ``None`` outside one (no Ray, or
    the driver)."""
    try:
        import ray

        if not ray.is_initialized() or ray.get_runtime_context().get_actor_id() is None:
            return None
        return [str(i) for i in ray.get_gpu_ids()]
    except ImportError:
        return None


def resolve_device() -> DeviceChoice:
    """:func:`decide_device` for this process."""
    import torch

    return decide_device(ray_actor_gpu_ids(), os.environ.get("CUDA_VISIBLE_DEVICES"), torch.cuda.is_available())
