"""``generator.weight_sync = "ipc"``: colocated on GPUs, each version goes from the learner's GPU
memory into the vLLM worker on the same GPU by CUDA IPC handles (vLLM's own IPC engine, packed).

No GPU is lent to this project, so these tests prove the seams on the CPU: what the trainer side
asks of vLLM's real ``IPCTrainerWeightTransferEngine`` (a recorder stands in for its
``trainer_init``, which needs CUDA), that the handles survive the trip to vLLM's real
``IPCWeightTransferUpdateInfo``, what the generator asks of its engine during an update, and the
recipes that are refused. docs/retool.md's "Never run on a GPU" names what a first GPU run checks.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import pytest
import torch

from agentrl.engine.generation import weight_transfer as wt
from agentrl.engine.generation.generator import EngineSettings, VllmGenerator, engine_kwargs
from agentrl.errors import GeneratorError
from tests.engine.generation.test_generator_units import fake_vllm


class Meta:
    """What ``ModelSource.metadata()`` yields per parameter (vLLM's ``ParamMeta`` fields)."""

    def __init__(self, name: str, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
        self.name, self.dtype, self.shape = name, dtype, shape


class Source:
    def __init__(self, metas: list[Meta]) -> None:
        self.metas = metas

    def metadata(self) -> list[Meta]:
        return self.metas


@pytest.fixture
def recorded_trainer_init(monkeypatch) -> list[tuple[Any, Any, Any]]:
    """vLLM's ``IPCTrainerWeightTransferEngine.trainer_init`` replaced by a recorder (the real
    one reads the CUDA device's UUID)."""
    from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerWeightTransferEngine

    calls: list[tuple[Any, Any, Any]] = []

    def record(cls, init_info, *, client, source=None):
        calls.append((init_info, client, source))
        return "engine"

    monkeypatch.setattr(IPCTrainerWeightTransferEngine, "trainer_init", classmethod(record))
    return calls


def test_the_trainer_side_is_vllms_ipc_engine_packed_with_a_buffer_that_holds_the_largest_parameter(recorded_trainer_init):
    from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

    # a Qwen2.5-7B-sized embedding in bfloat16: 152064 x 3584 x 2 bytes = 1.09 GB > 1 GiB
    source = Source([Meta("model.embed_tokens.weight", torch.bfloat16, (152064, 3584)), Meta("model.norm.weight", torch.bfloat16, (3584,))])
    client = object()
    for rank in (0, 1):
        got = wt.trainer_connect("ipc", rank=rank, address="unused", port=0, world_size=0, client=client if rank == 0 else None,
                                 source=source, timeout_s=5.0)
        assert got == "engine"
    (info0, client0, source0), (info1, _, _) = recorded_trainer_init
    assert isinstance(info0, IPCTrainerInitInfo) and info0.packed
    assert info0.packed_buffer_size_bytes == 152064 * 3584 * 2 and client0 is client and source0 is source
    assert info0.is_sender and not info1.is_sender  # rank 0 ships the handles of every rank


def test_the_ipc_buffer_is_one_gib_unless_a_parameter_is_larger():
    assert wt.ipc_buffer_bytes([10, 2**20]) == 2**30
    assert wt.ipc_buffer_bytes([2**31 + 3]) == 2**31 + 3
    assert wt.ipc_buffer_bytes([]) == 2**30


def test_ipc_handles_reach_vllms_update_info_intact_through_the_engine_channel(monkeypatch):
    """The handles hold a class, a dtype and bytes (what ``reduce_tensor`` returns), which vLLM's
    msgpack channel to its engine process does not carry: they travel pickled, and vLLM's own
    update-info class (with the environment the generator sets) decodes them to the same."""
    from vllm.distributed.weight_transfer.ipc_engine import IPCWeightTransferUpdateInfo

    handles = {"GPU-0b1c": (torch.Tensor, (4, 4), (4, 1), 0, torch.UntypedStorage, torch.bfloat16, 0, b"\x00\x01handle", 32, 0)}
    info = {"names": ["w"], "dtype_names": ["bfloat16"], "shapes": [[4, 4]], "ipc_handles": handles, "tensor_sizes": [32]}
    safe = wt.ipc_transport_safe(info)
    assert "ipc_handles" not in safe and isinstance(safe["ipc_handles_pickled"], str)
    assert info["ipc_handles"] is handles  # the caller's dict is not changed
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    decoded = IPCWeightTransferUpdateInfo(**safe)
    assert decoded.ipc_handles == handles and decoded.names == ["w"]
    nccl_info = {"names": ["w"], "dtype_names": ["float32"], "shapes": [[2]], "packed": False}
    assert wt.ipc_transport_safe(nccl_info) is nccl_info  # other backends pass unchanged


class RecordingClient(wt.GeneratorClient):
    """The client's fan-out replaced by a record of each call."""

    def __init__(self, n: int) -> None:
        super().__init__([object()] * n, timeout_s=1.0)
        self.calls: list[tuple[str, tuple, Any]] = []

    def _all(self, method: str, *args: Any, per_generator: list[tuple[Any, ...]] | None = None) -> list[Any]:
        self.calls.append((method, args, per_generator))
        return []


def test_every_generator_gets_the_ipc_wire_settings_as_they_are():
    client = RecordingClient(2)
    client.init_weight_transfer_engine({"packed": True})
    assert client.calls == [("init_weight_transfer", ({"packed": True},), None)]
    client.calls.clear()
    client.init_weight_transfer_engine({"world_size": 3, "master_port": 1})  # a group: one rank offset each
    (_, _, per_generator), = client.calls
    assert [a[0]["rank_offset"] for a in per_generator] == [1, 2]


class UpdatingEngine:
    """The ``AsyncLLM`` methods of a sleep and a direct weight update, recording each call."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    async def sleep(self, level: int = 1, mode: str = "abort") -> None:
        self.calls.append(("sleep", level))

    async def wake_up(self, tags=None) -> None:
        self.calls.append(("wake_up", tuple(tags or ())))

    async def pause_generation(self, mode: str = "abort", clear_cache: bool = True) -> None:
        self.calls.append(("pause",))

    async def start_weight_update(self) -> None:
        self.calls.append(("start",))

    async def update_weights(self, request) -> None:
        self.calls.append(("update", request.update_info))

    async def finish_weight_update(self, version: str) -> None:
        self.calls.append(("finish", version))

    async def resume_generation(self) -> None:
        self.calls.append(("resume",))

    async def update_weight_version(self, version: str) -> None:
        self.calls.append(("version", version))


def test_an_asleep_generator_wakes_its_weights_only_then_receives_pickled_handles():
    g = VllmGenerator(EngineSettings(model="unused", sleep_mode=True, weight_transfer="ipc"))
    g.engine = engine = UpdatingEngine()
    g._on_gpu = True  # what start() found

    async def one_update() -> None:
        await g.sleep(2)
        await g.begin_weight_update()
        await g.receive_weights({"names": ["w"], "dtype_names": ["bfloat16"], "shapes": [[1]], "ipc_handles": {"GPU-0": (1,)}})
        await g.end_weight_update(5)

    asyncio.run(one_update())
    kinds = [c[0] for c in engine.calls]
    assert engine.calls[1] == ("wake_up", ("weights",))  # the KV cache stays asleep while the learner's buffer is on the GPU
    assert kinds[1:5] == ["wake_up", "pause", "start", "update"] and kinds[-1] == "resume"
    update_info = next(c[1] for c in engine.calls if c[0] == "update")
    assert "ipc_handles_pickled" in update_info and "ipc_handles" not in update_info
    assert g.version == 5


def test_a_cpu_engine_refuses_ipc_in_words(monkeypatch):
    monkeypatch.delenv("VLLM_ALLOW_INSECURE_SERIALIZATION", raising=False)
    with pytest.raises(GeneratorError, match='weight_sync = "ipc" is CUDA IPC'):
        asyncio.run(VllmGenerator(EngineSettings(model="unused", weight_transfer="ipc")).start())
    import os

    assert "VLLM_ALLOW_INSECURE_SERIALIZATION" not in os.environ  # refused before anything is loosened


def test_the_ipc_permission_reaches_the_engines_start_and_does_not_stay(monkeypatch):
    """The engine's worker unpickles the learner's IPC handles, so its processes start with
    VLLM_ALLOW_INSECURE_SERIALIZATION=1; the actor that starts them must not keep it (vLLM would
    then unpickle whatever reaches the actor's own channels). ``AsyncLLM`` always runs its engine
    core in a process of its own, even under the user's VLLM_ENABLE_V1_MULTIPROCESSING=0."""
    import os

    from agentrl.engine.common.devices import DeviceChoice
    from agentrl.engine.generation import generator as gen_mod

    seen = fake_vllm(monkeypatch, lambda args: os.environ.get("VLLM_ALLOW_INSECURE_SERIALIZATION"))
    monkeypatch.setattr(gen_mod, "resolve_device", lambda: DeviceChoice(on_gpu=True, cuda_index=0, cuda_visible=True, reason="a fake GPU"))
    monkeypatch.setattr(wt, "register", lambda: None)
    monkeypatch.delenv("VLLM_ALLOW_INSECURE_SERIALIZATION", raising=False)
    asyncio.run(VllmGenerator(EngineSettings(model="unused", weight_transfer="ipc")).start())
    assert seen == ["1"]
    assert "VLLM_ALLOW_INSECURE_SERIALIZATION" not in os.environ
    # other transports never loosen it
    monkeypatch.delenv("VLLM_ALLOW_INSECURE_SERIALIZATION", raising=False)
    asyncio.run(VllmGenerator(EngineSettings(model="unused", weight_transfer="nccl")).start())
    assert seen[-1] is None and "VLLM_ALLOW_INSECURE_SERIALIZATION" not in os.environ


def test_the_installed_vllm_has_the_ipc_engine_agentrl_uses():
    from vllm.config.weight_transfer import WeightTransferConfig
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
    from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo, IPCTrainerWeightTransferEngine

    assert "ipc" in WeightTransferEngineFactory._registry
    WeightTransferConfig(**engine_kwargs(EngineSettings(model="m", weight_transfer="ipc"), on_gpu=True)["weight_transfer_config"])
    info = IPCTrainerInitInfo(rank=0, packed=True, packed_buffer_size_bytes=2**30)
    assert info.backend == "ipc"
    inspect.signature(IPCTrainerWeightTransferEngine.trainer_init).bind(info, client=None, source=None)
    assert callable(IPCTrainerWeightTransferEngine.shutdown)  # the send watchdog's abort
