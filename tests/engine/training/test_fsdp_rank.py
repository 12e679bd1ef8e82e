"""FsdpRank's choices that depend on the device: FSDP units per decoder layer, and the AdamW kernel.

On an H100 (benchmarks/RESULTS.md, "The learner on a GPU") one rank with the whole model as one
FSDP unit held a second, full copy of the model during the step, and torch's multi-tensor AdamW a
temporary as large as the moments: both set the peak. These tests pin the choices that removed
them on GPUs and kept the CPU's path as it was; the GPU check itself is
``benchmarks/gpu_learner_check.py``."""

from __future__ import annotations

import pytest
import torch

from agentrl.engine.training.fsdp_rank import per_layer_units
from tests.engine.training.ranks import BareRank


@pytest.mark.parametrize(
    ("world_size", "device", "expected"),
    [(1, "cpu", False), (1, "cuda", True), (2, "cpu", True), (4, "cuda", True)],
)
def test_units_per_layer_everywhere_but_one_rank_on_the_cpu(world_size, device, expected):
    assert per_layer_units(world_size, torch.device(device)) is expected


class DecoderLayer(torch.nn.Linear):
    """A stand-in decoder layer (FSDP's unit is chosen by this class name)."""


class Body(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([DecoderLayer(4, 4) for _ in range(3)])


class LM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.model = Body()
        self.head = torch.nn.Linear(4, 2)


def Rank(device: str) -> BareRank:
    return BareRank(device, LM())


@pytest.fixture
def wrapped(monkeypatch) -> list[str]:
    """The modules ``fully_shard`` is called on, by class name, in order (recorded, not done)."""
    import torch.distributed.fsdp as fsdp

    seen: list[str] = []
    monkeypatch.setattr(fsdp, "fully_shard", lambda module, **kw: seen.append(type(module).__name__))
    return seen


def test_one_rank_on_a_gpu_shards_each_decoder_layer(wrapped):
    r = Rank("cuda")
    r.shard(r.module, r.module)
    assert wrapped == ["DecoderLayer", "DecoderLayer", "DecoderLayer", "LM"]


def test_one_rank_on_the_cpu_keeps_one_unit(wrapped):
    r = Rank("cpu")
    r.shard(r.module, r.module)
    assert wrapped == ["LM"]


def test_adamw_is_fused_on_a_gpu_and_the_default_on_the_cpu():
    gpu, cpu = Rank("cuda"), Rank("cpu")
    gpu.build_optimizer()  # the parameters are on the CPU here; only the rank's device decides
    cpu.build_optimizer()
    assert gpu.optimizer.defaults["fused"] is True
    assert not cpu.optimizer.defaults["fused"]
    assert cpu.optimizer.defaults["foreach"] is None  # torch's own default (multi-tensor on GPUs)
