"""Groups of trajectories become learner samples: advantages, filters, penalty (recipe values via wiring)."""

from __future__ import annotations

import pytest

from agentrl.config import validate_recipe
from agentrl.engine.loop.batching import BatchSettings, batch_samples
from agentrl.engine.wiring import batch_settings
from agentrl.engine.common.trajectory import Trajectory


def _traj(reward: float, group: str, generated: int, status: str = "ok") -> Trajectory:
    n = 3 + generated
    return Trajectory(
        tokens=list(range(5, 5 + n)), loss_mask=[0] * 3 + [1] * generated, behaviour_logprobs=[0.0] * 3 + [-1.0] * generated,
        versions=[-1] * 3 + [0] * generated, reward=reward, group_id=group, sample_index=0, prompt_index=0, status=status,
    )


def _settings(**algo) -> BatchSettings:
    return batch_settings(validate_recipe({"model": {"path": "unused"}, "rollout": {"group_size": 2}, "learner": {"batch_size": 4}, "algo": algo}))


def test_advantages_per_group_and_infra_failures_left_out():
    batch = [[_traj(1.0, "a", 4), _traj(0.0, "a", 4)], [_traj(1.0, "b", 4), _traj(0.0, "b", 4, status="infra_failure")]]
    samples, stats = batch_samples(batch, _settings(advantage="dr_grpo"))
    assert [s["advantage"] for s in samples] == [0.5, -0.5, 0.0]
    assert stats["infra_failures_batch"] == 1
    assert samples[0]["versions"] == [-1, -1, -1, 0, 0, 0, 0]


def test_zero_variance_groups_dropped_and_overlong_penalty():
    batch = [[_traj(1.0, "a", 4), _traj(1.0, "a", 4)], [_traj(1.0, "b", 4), _traj(1.0, "b", 8)]]
    ctl = _settings(advantage="dr_grpo", dynamic_sampling="drop", overlong_max_tokens=8, overlong_buffer_tokens=4)
    samples, stats = batch_samples(batch, ctl)
    # group b: 8 generated tokens sit at the end of the ramp -> penalty -1 -> rewards (1, 0)
    assert stats["zero_variance_groups_dropped"] == 1
    assert [s["advantage"] for s in samples] == pytest.approx([0.5, -0.5])
    assert stats["overlong_penalty_mean"] == pytest.approx(-0.25)
    # everything filtered: an empty list (the learner accepts it)
    samples, stats = batch_samples([[_traj(1.0, "a", 2), _traj(1.0, "a", 2)]], ctl)
    assert samples == [] and stats["zero_variance_groups_dropped"] == 1


def test_an_episode_of_several_segments_gives_one_sample_per_segment_with_its_advantage():
    seg = Trajectory(tokens=[1, 2, 3, 4, 5, 6, 7], loss_mask=[0, 1, 1, 0, 0, 1, 0], behaviour_logprobs=[0.0, -1, -1, 0, 0, -1, 0],
                     versions=[-1, 0, 0, -1, -1, 1, -1], reward=1.0, group_id="a", sample_index=0, prompt_index=0, segment_starts=(3,))
    samples, _ = batch_samples([[seg, _traj(0.0, "a", 2)]], _settings(advantage="dr_grpo"))
    assert [s["id"] for s in samples] == ["a/0#0", "a/0#1", "a/0"]
    assert samples[0]["tokens"] == [1, 2, 3] and samples[1]["tokens"] == [4, 5, 6, 7] and samples[1]["versions"] == [-1, -1, 1, -1]
    assert [s["advantage"] for s in samples] == [0.5, 0.5, -0.5]
    with pytest.raises(ValueError, match="segment_starts"):
        Trajectory(tokens=[1, 2], loss_mask=[0, 1], behaviour_logprobs=[0, 0], versions=[-1, 0], reward=0, group_id="a",
                   sample_index=0, prompt_index=0, segment_starts=(2,))


def test_agent_failures_are_counted_apart_from_infra_failures():
    batch = [[_traj(1.0, "a", 2), _traj(0.0, "a", 2, status="agent_failure"), _traj(0.0, "a", 2, status="infra_failure")]]
    samples, stats = batch_samples(batch, _settings())
    assert len(samples) == 1 and stats["agent_failures_batch"] == 1 and stats["infra_failures_batch"] == 1


def test_the_batch_says_where_its_episodes_time_went_over_the_episodes_that_measured_it():
    timed = [_traj(1.0, "a", 4), _traj(0.0, "a", 4)]
    for t, (gen, env) in zip(timed, [(1.0, 0.5), (3.0, 1.5)]):
        t.metrics.update(latency_s=gen + env + 0.1, generate_s=gen, env_s=env)
    untimed = [_traj(1.0, "b", 4), _traj(0.0, "b", 4)]  # agent episodes measure no split
    _, stats = batch_samples([timed, untimed], _settings())
    assert stats["episode_generate_s_mean"] == 2.0 and stats["episode_env_s_mean"] == 1.0
    assert stats["episode_s_mean"] == pytest.approx(3.1)
    _, none = batch_samples([untimed], _settings())
    assert "episode_generate_s_mean" not in none
