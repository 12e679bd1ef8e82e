"""The critic trains in the learner's precision and with its activation checkpointing, through the
one set-up both use (:mod:`agentrl.engine.training.model_setup`).

Mixed precision is decided for a CUDA device only; there is no GPU here, so the tests stop at the
seam: ``model_setup.mixed_precision`` is asked as if the device were CUDA (its own decision, not
a stand-in policy), and the sharded modules must then carry that policy. FSDP2 runs bfloat16 on
the CPU, so the critic's values and an update are computed for real in it.
"""

from __future__ import annotations

import pytest
import torch
from torch.distributed.fsdp import MixedPrecisionPolicy

from agentrl.engine.training import model_setup
from agentrl.engine.training.critic import Critic
from agentrl.engine.training.fsdp_rank import decoder_layers
from tests.engine.training.test_learner_correctness import free_port, make_learner


def _mp_policy(module: torch.nn.Module) -> MixedPrecisionPolicy:
    """The mixed-precision policy ``fully_shard`` gave ``module``."""
    return module._get_fsdp_state()._fsdp_param_group.mp_policy  # type: ignore[operator]


def test_mixed_precision_is_bfloat16_compute_and_float32_reductions_on_cuda_and_cpu_alike() -> None:
    for device in (torch.device("cuda", 0), torch.device("cpu")):
        policy = model_setup.mixed_precision(torch.bfloat16, device)
        assert policy is not None and (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32)
        assert model_setup.mixed_precision(torch.float16, device) is None  # would need loss scaling
        assert model_setup.mixed_precision(torch.float32, device) is None
    assert model_setup.frozen_dtype(policy) == torch.bfloat16 and model_setup.frozen_dtype(None) == torch.float32


def test_the_critic_gets_the_learners_mixed_precision_and_checkpointed_layers(tiny_calc_model) -> None:
    critic = Critic(
        rank=0, world_size=1, master_addr="127.0.0.1", master_port=free_port(), model=str(tiny_calc_model),
        micro_batch_tokens=64, seed=0, dtype="bfloat16", activation_checkpointing=True,
    )
    info = critic.setup()
    try:
        policy = _mp_policy(critic.model)
        assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32)
        assert info["mixed_precision"] == "torch.bfloat16" and info["activation_checkpointing"] is True
        assert {p.dtype for p in critic.model.parameters()} == {torch.float32}  # master weights
        layers = decoder_layers(critic.model.trunk)
        assert layers and all(layer.gradient_checkpointing for layer in layers)
        assert critic.model.trunk.is_gradient_checkpointing
        rows = [{"tokens": [1, 5, 9, 7, 3, 2], "loss_mask": [0, 0, 1, 1, 1, 1], "returns": [0.0, 0.0, 1.0, 1.0, 1.0, 1.0],
                 "values": [0.0] * 6}]
        assert critic.values(rows)[0] == [0.0] * 6  # the zero head, through a bfloat16 trunk and head
        metrics = critic.train_step(rows)
        assert metrics["value_tokens"] == 4 and metrics["value_grad_norm"] > 0
        assert any(v != 0.0 for v in critic.values(rows)[0][2:])
    finally:
        critic.shutdown()


def test_without_the_options_the_critic_trains_in_float32_without_checkpointing(tiny_calc_model) -> None:
    critic = Critic(rank=0, world_size=1, master_addr="127.0.0.1", master_port=free_port(), model=str(tiny_calc_model), seed=0)
    critic.setup()
    try:
        assert _mp_policy(critic.model).param_dtype is None
        assert not any(layer.gradient_checkpointing for layer in decoder_layers(critic.model.trunk))
    finally:
        critic.shutdown()


def test_the_learner_gets_the_same_policy_from_the_same_seam(tiny_calc_model) -> None:
    learner = make_learner(str(tiny_calc_model), dtype="bfloat16", activation_checkpointing=True)
    try:
        policy = _mp_policy(learner.policy)
        assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32)
        assert all(layer.gradient_checkpointing for layer in decoder_layers(learner.policy.lm))
    finally:
        learner.shutdown()


def test_wiring_gives_the_critic_the_models_dtype_and_the_learners_checkpointing_unless_set() -> None:
    from agentrl.engine import wiring
    from tests.engine.test_wiring import recipe

    r = recipe(algo={"advantage": "gae"}, model={"path": "unused", "dtype": "bfloat16"}, learner={"activation_checkpointing": True})
    kw = wiring.critic_kwargs(r, model="/start")
    assert kw["dtype"] == "bfloat16" and kw["activation_checkpointing"] is True
    r = recipe(algo={"advantage": "gae"}, learner={"activation_checkpointing": True}, critic={"activation_checkpointing": False})
    assert wiring.critic_kwargs(r, model="/start")["activation_checkpointing"] is False
    assert wiring.critic_kwargs(recipe(algo={"advantage": "gae"}), model="/start")["activation_checkpointing"] is False


def test_a_lora_base_stays_in_the_compute_dtype_and_the_adapter_trains_in_float32(tiny_calc_model) -> None:
    from tests.engine.training.test_learner_correctness import make_samples

    learner = make_learner(str(tiny_calc_model), dtype="bfloat16", lora={"rank": 4, "alpha": 8.0})
    try:
        dtypes = {n: p.dtype for n, p in learner.policy.named_parameters()}
        base = {d for n, d in dtypes.items() if ".lora_" not in n}
        adapter = {d for n, d in dtypes.items() if ".lora_" in n}
        assert base == {torch.bfloat16} and adapter == {torch.float32}, dtypes
        assert all(p.requires_grad == (".lora_" in n) for n, p in learner.policy.named_parameters())
        metrics = learner.train_step(make_samples(2, seed=3))
        assert metrics["trained_tokens"] > 0 and metrics["grad_norm"] > 0
    finally:
        learner.shutdown()


def test_a_rank_on_the_cpu_of_a_gpu_node_keeps_to_its_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """A critic rank Ray gave no GPU, on a node where CUDA is visible, computes on the CPU: it
    must use its ``torch_threads``, not every core (the device decides, not CUDA's presence)."""
    from agentrl.engine.common.devices import DeviceChoice
    from agentrl.engine.training import devices

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(devices, "resolve_device", lambda: DeviceChoice(
        on_gpu=False, cuda_index=0, cuda_visible=True, reason="a Ray actor given no GPU"))
    before = torch.get_num_threads()
    want = 1 if before != 1 else 2
    critic = Critic(rank=0, world_size=1, master_addr="127.0.0.1", master_port=free_port(), model="unused", torch_threads=want)
    try:
        assert critic.join_group() == "gloo" and critic.device.type == "cpu"
        assert torch.get_num_threads() == want
    finally:
        critic.shutdown()
        torch.set_num_threads(before)


def test_a_gpu_learner_with_a_cpu_critic_is_refused_unless_asked_for() -> None:
    from agentrl.errors import ConfigError
    from tests.engine.test_wiring import recipe

    with pytest.raises(ConfigError, match=r"critic.num_gpus = 0 beside a GPU learner \(learner.num_gpus = 1\).*critic.allow_cpu = true"):
        recipe(algo={"advantage": "gae"}, learner={"num_gpus": 1})
    recipe(algo={"advantage": "gae"}, learner={"num_gpus": 1}, critic={"allow_cpu": True})  # asked for explicitly
    recipe(algo={"advantage": "gae"}, learner={"num_gpus": 1}, critic={"num_gpus": 1})
    recipe(algo={"advantage": "gae"})  # everything on the CPU
    recipe(learner={"num_gpus": 1})  # no critic
