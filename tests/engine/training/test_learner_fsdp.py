"""The learner for real: FSDP2 over gloo (one rank in this process), a step, a published version."""

import socket

import torch
from transformers import AutoModelForCausalLM

from agentrl.engine.common.audit import read_audit
from agentrl.engine.training.devices import process_group_backend
from agentrl.engine.training.learner import Learner


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
    audit = tmp_path / "audit" / "learner.jsonl"
    learner = Learner(
        rank=0, world_size=1, master_addr="127.0.0.1", master_port=_port(), model=str(tiny_calc_model), lr=1e-3,
        audit_path=str(audit),
    )
    try:
        info = learner.setup()
        assert info["backend"] == process_group_backend(torch.cuda.is_available()) and info["parameters"] > 0
        before = AutoModelForCausalLM.from_pretrained(tiny_calc_model).state_dict()
        batch = [_sample([5, 6, 7, 8, 9, 10], 1.0), _sample([5, 6, 7, 11, 12], -1.0), _sample([5, 6, 7, 8], 0.5)]
        batch[0]["id"] = "p0/0"
        metrics = learner.train_step(batch)
        assert metrics["trained_tokens"] == 3 + 2 + 1
        # the learner's own append-only record of what it trained on
        (record,) = read_audit(audit)
        assert record["step"] == 1 and [s["id"] for s in record["samples"]] == ["p0/0", None, None]
        assert [s["tokens"] for s in record["samples"]] == [6, 5, 4]
        assert len({s["prompt_sha1"] for s in record["samples"]}) == 1  # all three share the prompt 5, 6, 7
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
