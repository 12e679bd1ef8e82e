"""The collective weight transfer's GPU paths, proven on the CPU at their seams (no GPU here):

- a GPU learner's gloo broadcast hands the CPU-only gloo group host tensors: the learner's
  module is built on a *fake* CUDA device (torch's FakeTensorMode: tensors that say ``cuda``
  and hold no data), and the group's broadcast is replaced by a recorder of what it is given;
- the weights leave the learner in the wire dtype before the FSDP gather: a real DTensor
  sharded over two ranks of torch's in-process fake process group, with a dispatch mode that
  records the dtype of every all-gather (the collective ``full_tensor()`` runs).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from agentrl.engine.generation import weight_transfer as wt


class GatherDtypes(TorchDispatchMode):
    """Records the input dtype of every all-gather dispatched inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.dtypes: list[torch.dtype] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if "all_gather" in str(func):
            self.dtypes.append(args[0].dtype)
        return func(*args, **(kwargs or {}))


@pytest.fixture
def two_fake_ranks() -> Iterator[Any]:
    """A 2-rank device mesh of torch's fake process group (one process; collectives return
    placeholders of the right shape and dtype)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        yield init_device_mesh("cpu", (2,))
    finally:
        dist.destroy_process_group()


def sharded_linear(mesh: Any) -> torch.nn.Module:
    """A float32 Linear whose parameters are DTensors sharded on dim 0 over ``mesh`` (as FSDP2 holds them)."""
    from torch.distributed.tensor import Shard, distribute_tensor

    lm = torch.nn.Linear(4, 6)
    for name, p in list(lm.named_parameters()):
        setattr(lm, name, torch.nn.Parameter(distribute_tensor(p.detach(), mesh, [Shard(0)])))
    return lm


def test_the_nccl_source_gathers_in_the_wire_dtype_not_float32(two_fake_ranks):
    lm = sharded_linear(two_fake_ranks)
    source = wt.model_source(lm, torch.bfloat16)
    with GatherDtypes() as seen:
        sent = list(source)
    assert [n for n, _ in sent] == ["weight", "bias"]
    assert all(t.dtype == torch.bfloat16 and not hasattr(t, "full_tensor") for _, t in sent)
    assert seen.dtypes == [torch.bfloat16, torch.bfloat16], f"the source gathered {seen.dtypes} and cast afterwards"
    assert [tuple(m.shape) for m in source.metadata()] == [(6, 4), (6,)]


def test_the_disk_export_gathers_in_the_serving_dtype_not_float32(two_fake_ranks):
    from agentrl.engine.training.weight_export import full_state_dict

    lm = sharded_linear(two_fake_ranks)
    with GatherDtypes() as seen:
        sd = full_state_dict(lm, rank=0, dtype=torch.bfloat16)
    assert {k: (v.dtype, tuple(v.shape)) for k, v in sd.items()} == {"weight": (torch.bfloat16, (6, 4)), "bias": (torch.bfloat16, (6,))}
    assert seen.dtypes == [torch.bfloat16, torch.bfloat16], f"the export gathered {seen.dtypes} and cast afterwards"
    with GatherDtypes() as master:  # no dtype: the float32 master weights, as before
        assert full_state_dict(lm, rank=0)["weight"].dtype == torch.float32
    assert master.dtypes == [torch.float32, torch.float32]


def test_a_gpu_learners_gloo_broadcast_hands_the_cpu_group_host_tensors(monkeypatch):
    """vLLM's gloo group registers only the CPU device (vllm.distributed.utils.init_gloo_process_group):
    a CUDA tensor given to it fails, after the generators have paused for the update."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    classes = wt._classes()
    given: list[tuple[str, torch.dtype, int]] = []
    monkeypatch.setattr(wt, "_broadcast", lambda group, tensor, timeout_s: given.append((tensor.device.type, tensor.dtype, tensor.numel())))
    with FakeTensorMode(allow_non_fake_inputs=True):
        lm = torch.nn.Linear(4, 6, device="meta")
        lm.weight = torch.nn.Parameter(torch.empty(6, 4, device="cuda"))  # a GPU learner's parameters (fake: no CUDA here)
        lm.bias = torch.nn.Parameter(torch.empty(6, device="cuda"))
        assert lm.weight.device.type == "cuda"
        source = wt.model_source(lm, torch.bfloat16)
        engine = classes["trainer"](client=None, source=source, is_sender=True, packed=False)
        engine.model_update_group, engine.timeout_s = object(), 5.0
        engine._broadcast(source, source.metadata())
    assert given == [("cpu", torch.bfloat16, 6 * 4 + 6)], f"the gloo group was given {given}"
