"""``learner.offload_states`` (colocated on GPUs): a rank's parameters and AdamW moments go to
host memory while vLLM generates and come back for the next computation.

No GPU is lent to this project: the moves are proven with the ``meta`` device standing for the
GPU (every tensor that should move does, the ``Parameter`` objects the optimizer holds stay the
same, on a real FSDP2-sharded module too), and the rank's bookkeeping with the move recorded."""

from __future__ import annotations

import socket

import pytest
import torch

from agentrl.engine.training import fsdp_rank as fsdp_rank_module
from agentrl.engine.training.offload import move_states
from tests.engine.training.ranks import BareRank, run_ranks


def trained(module: torch.nn.Module) -> torch.optim.AdamW:
    """``module`` after one AdamW update (so the optimizer holds its moments)."""
    opt = torch.optim.AdamW(module.parameters(), lr=1e-2)
    module(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return opt


def test_every_parameter_buffer_and_moment_moves():
    module = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
    opt = trained(module)
    moments = sum(v.numel() * v.element_size() for st in opt.state.values() for k, v in st.items() if k != "step")
    assert move_states(module, opt, torch.device("meta")) == moments
    assert all(t.device.type == "meta" for t in [*module.parameters(), *module.buffers()])
    for state in opt.state.values():
        assert state["exp_avg"].device.type == state["exp_avg_sq"].device.type == "meta"
        assert state["step"].device.type == "cpu"  # AdamW keeps its scalar step on the host


def _fsdp2_rank(rank: int, port: int) -> None:
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=1)
    module = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    fully_shard(module)
    opt = trained(module)
    params = [id(p) for p in module.parameters()]
    move_states(module, opt, torch.device("meta"))
    assert all(type(p).__name__ == "DTensor" and p.device.type == "meta" for p in module.parameters())
    assert [id(p) for p in module.parameters()] == params == [id(p) for p in opt.param_groups[0]["params"]]
    assert all(st["exp_avg"].device.type == "meta" for st in opt.state.values())
    dist.destroy_process_group()


def test_an_fsdp2_sharded_module_moves_with_its_parameter_objects_kept():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run_ranks(_fsdp2_rank, lambda rank: (rank, port), world=1, timeout_s=120)


def Rank(device: str) -> BareRank:
    """The smallest FsdpRank: one linear layer, its AdamW."""
    r = BareRank(device, torch.nn.Linear(2, 2))
    r.build_optimizer()
    return r


@pytest.fixture
def moves(monkeypatch) -> list[str]:
    """The devices the rank moves its states to, in order (the move itself recorded, not done)."""
    seen: list[str] = []
    monkeypatch.setattr(fsdp_rank_module, "move_states", lambda module, opt, device: seen.append(device.type) or 0)
    return seen


def test_an_offloaded_rank_comes_back_for_a_computation_and_goes_away_again(moves):
    r = Rank("cuda")
    r.offload_states()
    assert r.offloaded and moves == ["cpu"]
    assert r.offload_states() == 0.0 and moves == ["cpu"]  # away already: nothing moves twice
    with r.states_on_device():  # a checkpoint or an export while offloaded
        assert not r.offloaded
    assert r.offloaded and moves == ["cpu", "cuda", "cpu"]
    r.reload_states()  # a training step brings them back and they stay
    assert not r.offloaded and moves == ["cpu", "cuda", "cpu", "cuda"]
    with r.states_on_device():  # on the device: nothing moves
        pass
    assert moves == ["cpu", "cuda", "cpu", "cuda"] and r.reload_states() == 0.0


def test_a_cpu_rank_has_nothing_to_offload(moves):
    r = Rank("cpu")
    assert r.offload_states() == 0.0 and not r.offloaded and moves == []
