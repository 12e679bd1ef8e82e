"""Degenerate steps and evaluations: the words, the cause and the recipe key."""

from __future__ import annotations

from agentrl.engine.loop.batching import BatchSettings, batch_samples
from agentrl.engine.loop.degenerate import diagnose_eval, diagnose_step
from agentrl.engine.loop.evaluation import summarise
from agentrl.engine.common.trajectory import Trajectory


def episode(group: str, i: int, *, prompt: int = 5, generated: int = 3, reward: float = 0.0, status: str = "ok") -> Trajectory:
    n = prompt + generated
    return Trajectory(tokens=list(range(n)), loss_mask=[0] * prompt + [1] * generated, behaviour_logprobs=[0.0] * n,
                      versions=[-1] * prompt + [0] * generated, reward=reward, group_id=group, sample_index=i, prompt_index=0, status=status)


def test_every_prompt_over_the_limit_names_the_key_and_the_prompt_length():
    batch = [[episode("a", i, prompt=731, generated=0, status="overflow") for i in range(2)]] * 16
    samples, stats = batch_samples(batch, BatchSettings())
    assert stats["samples_trained"] == 0 and stats["trained_tokens_batch"] == 0
    msg = diagnose_step(stats, max_episode_tokens=512)
    assert msg.startswith("all 32 episodes exceeded rollout.max_episode_tokens=512 before the first turn: the prompt is 731 tokens")
    metrics = summarise([episode("e", 0, prompt=731, generated=0, status="overflow")] * 4)
    assert "all 4 evaluation episodes exceeded rollout.max_episode_tokens" in diagnose_eval(metrics)


def test_no_learning_signal_and_failures_and_healthy_steps():
    flat = [[episode("a", 0, reward=1.0), episode("a", 1, reward=1.0)], [episode("b", 0), episode("b", 1)]]
    _, stats = batch_samples(flat, BatchSettings())
    assert "every one of the 2 groups had equal rewards" in diagnose_step(stats) and "rollout.group_size" in diagnose_step(stats)
    failed = [[episode("a", 0, status="infra_failure"), episode("a", 1, status="agent_failure")]]
    _, stats = batch_samples(failed, BatchSettings())
    assert "every one of the 2 episodes failed (1 on infrastructure, 1 in the agent program)" in diagnose_step(stats)
    healthy = [[episode("a", 0, reward=1.0), episode("a", 1)], [episode("b", 0), episode("b", 1)]]
    _, stats = batch_samples(healthy, BatchSettings())
    assert diagnose_step(stats) is None and stats["samples_trained"] == 4
    filtered = batch_samples(flat, BatchSettings(dynamic_sampling="drop"))[1]
    assert filtered["trained_tokens_batch"] == 0 and "no token was trained" in diagnose_step(filtered)
    assert diagnose_eval(summarise([episode("e", 0, reward=1.0)])) is None
    assert "every one of the 2 evaluation episodes failed" in diagnose_eval(summarise([episode("e", 0, status="infra_failure")] * 2))
