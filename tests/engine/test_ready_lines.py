"""The ready lines: one readable line per component (device, size, mode, start-up time), never
the raw start-up dicts."""

from __future__ import annotations

import asyncio

from agentrl.engine.ready_lines import clocked, critic_line, generators_line, learner_line

GEN = {"startup_s": 22.37451734299998, "device": "cpu", "pid": 4242, "node_id": "67fe" + "0" * 52}
RANK = {"rank": 0, "pid": 99, "backend": "gloo", "parameters": 1_089_536, "trainable_parameters": 1_089_536, "lora": None,
        "node_id": "67fe" + "0" * 52, "rendezvous": "192.0.2.2:39295", "mixed_precision": "off", "reference_model": False,
        "objective": {"policy_loss": "ppo"}}


def _no_dict(line: str) -> None:
    assert "{" not in line and "'" not in line and "node_id" not in line and "rendezvous" not in line, line


def test_generators_line():
    line = generators_line([GEN])
    assert line == "generators ready: 1 vLLM engine on cpu, started in 22.4 s"
    two = generators_line([GEN, {**GEN, "startup_s": 25.06, "node_id": "a1b2" + "0" * 52}])
    assert two == "generators ready: 2 vLLM engines on cpu, started in 22.4–25.1 s, on 2 nodes"
    remote = generators_line([{"startup_s": 0.1, "device": "remote", "url": "http://a:1"}, {"device": "remote", "url": "http://b:2"}])
    assert remote == "generators ready: 2 vLLM servers over HTTP (http://a:1, http://b:2)"


def test_learner_line():
    assert learner_line([RANK], 6.14) == "learner ready: 1 rank on cpu (gloo), 1.09 M parameters, full fine-tuning, started in 6.1 s"
    lora = {**RANK, "backend": "nccl", "parameters": 7_615_616_512, "trainable_parameters": 40_370_176, "lora": {"rank": 16},
            "mixed_precision": "torch.bfloat16", "reference_model": True}
    line = learner_line([lora, {**lora, "rank": 1}], 41.0)
    assert line == ("learner ready: 2 ranks on cuda (nccl), 7.62 B parameters, LoRA rank 16: 40.4 M of them trained, "
                    "mixed precision torch.bfloat16, KL reference model, started in 41.0 s")
    _no_dict(line)


def test_critic_line():
    line = critic_line([{"rank": 0, "pid": 1, "backend": "gloo", "parameters": 1_050_000}], 5.0)
    assert line == "critic ready: 1 rank on cpu (gloo), value model of 1.05 M parameters, started in 5.0 s"


def test_clocked_returns_the_result_and_a_duration():
    result, seconds = asyncio.run(clocked(asyncio.sleep(0, "x")))
    assert result == "x" and seconds >= 0
