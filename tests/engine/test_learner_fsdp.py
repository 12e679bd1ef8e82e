"""The learner for real: FSDP2 over gloo (one rank in this process), a step, a published version."""

import socket

import torch
from transformers import AutoModelForCausalLM

from agentrl.engine.learner import Learner


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sample(tokens, adv):
    n = len(tokens)
    return {
        "tokens": tokens,
        "loss_mask": [0] * 3 + [1] * (n - 3),
        "behaviour_logprobs": [0.0] * 3 + [-5.0] * (n - 3),
        "advantage": adv,
    }


def test_fsdp_step_and_publish(tiny_calc_model, tmp_path):
    learner = Learner(rank=0, world_size=1, master_addr="127.0.0.1", master_port=_port(), model=str(tiny_calc_model), lr=1e-3)
    try:
        info = learner.setup()
        assert info["backend"] == ("nccl" if torch.cuda.is_available() else "gloo") and info["parameters"] > 0
        before = AutoModelForCausalLM.from_pretrained(tiny_calc_model).state_dict()
        batch = [_sample([5, 6, 7, 8, 9, 10], 1.0), _sample([5, 6, 7, 11, 12], -1.0), _sample([5, 6, 7, 8], 0.5)]
        metrics = learner.train_step(batch)
        assert metrics["trained_tokens"] == 3 + 2 + 1
        assert metrics["grad_norm"] > 0
        assert 0.0 <= metrics["padding_fraction"] < 1.0
        out = learner.publish(str(tmp_path / "v1"))
        assert out is not None
        after = AutoModelForCausalLM.from_pretrained(out).state_dict()
        changed = [k for k in before if not torch.equal(before[k], after[k])]
        assert changed, "a step with non-zero advantages must change the weights"
        assert not any(p.name.startswith(".") for p in tmp_path.iterdir())  # no temporary left over
    finally:
        learner.shutdown()
