"""PPO's critic: GAE over a batch's samples, the value model's ranks, per-token advantages in the
learner. The critic runs for real (one FSDP2 rank over gloo in this process, the tiny model)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentrl.engine.training.critic import Critic
from agentrl.engine.loop.critic_stage import CriticStage, GaeSettings, gae_samples
from agentrl.errors import ConfigError, LearnerError
from tests.engine.training.test_learner_correctness import free_port, make_samples


def sample(tokens: list[int], mask: list[int], reward: float, sid: str) -> dict[str, Any]:
    return {"tokens": tokens, "loss_mask": mask, "reward": reward, "id": sid, "behaviour_logprobs": [0.0] * len(tokens)}


# ---------------------------------------------------------------- gae_samples (pure)
def test_gae_samples_runs_over_the_action_tokens_of_every_segment_of_an_episode() -> None:
    # episode a: two segments (a#0 holds actions at 2, 3; a#1 at 1); episode b: one segment
    a0 = sample([5, 6, 7, 8], [0, 0, 1, 1], 1.0, "g/0#0")
    a1 = sample([5, 9, 4], [0, 1, 0], 1.0, "g/0#1")
    b = sample([5, 6, 7], [0, 1, 1], 0.0, "g/1")
    values = [[0.0, 0.0, 0.2, 0.4], [0.0, 0.6, 0.0], [0.0, 0.5, 0.5]]
    out, stats = gae_samples([a0, a1, b], values, GaeSettings(gamma=1.0, lam=1.0, normalize=False))
    # gamma = lam = 1: every action token's advantage is R - V; the reward counts once, at a#1's token
    assert out[0]["advantages"] == pytest.approx([0.0, 0.0, 0.8, 0.6])
    assert out[1]["advantages"] == pytest.approx([0.0, 0.4, 0.0])
    assert out[2]["advantages"] == pytest.approx([0.0, -0.5, -0.5])
    assert out[0]["returns"] == pytest.approx([0.0, 0.0, 1.0, 1.0])
    assert out[2]["values"] == [0.0, 0.5, 0.5]
    assert stats["return_mean"] == pytest.approx(3 / 5)
    assert a0.get("advantages") is None  # the input is not changed


def test_gae_samples_lambda_below_one_bootstraps_from_the_next_action_value() -> None:
    s = sample([1, 2, 3, 4], [0, 1, 0, 1], 1.0, "g/0")  # position 2 is tool output: skipped
    out, _ = gae_samples([s], [[0.0, 0.5, 9.0, 0.8]], GaeSettings(gamma=1.0, lam=0.5, normalize=False))
    assert out[0]["advantages"] == pytest.approx([0.0, 0.4, 0.0, 0.2])  # the example of agentrl/algos/gae.py


def test_gae_samples_whitens_and_reports() -> None:
    ss = [sample([1, 2, 3], [0, 1, 1], float(i % 2), f"g/{i}") for i in range(4)]
    out, stats = gae_samples(ss, [[0.0, 0.5, 0.5]] * 4, GaeSettings())
    adv = [a for o in out for a, m in zip(o["advantages"], o["loss_mask"]) if m]
    assert sum(adv) == pytest.approx(0.0, abs=1e-9)
    assert sum(a * a for a in adv) / len(adv) == pytest.approx(1.0, rel=1e-6)
    assert stats["value_explained_variance"] == pytest.approx(0.0, abs=1e-9)  # a constant critic explains nothing
    with pytest.raises(ValueError, match="value lists"):
        gae_samples(ss, [[0.0] * 3], GaeSettings())


# ---------------------------------------------------------------- the value model, for real
@pytest.fixture(scope="module")
def critic(tiny_calc_model) -> Critic:
    c = Critic(rank=0, world_size=1, master_addr="127.0.0.1", master_port=free_port(), model=str(tiny_calc_model),
               lr=3e-3, value_clip=None, micro_batch_tokens=96, seed=0)
    c.setup()
    yield c
    c.shutdown()


def targets(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Returns that depend on the first token's parity: a task a value model can learn."""
    out = []
    for s in samples:
        r = float(s["tokens"][0] % 2)
        out.append({**s, "returns": [r if m else 0.0 for m in s["loss_mask"]], "values": [0.0] * len(s["tokens"])})
    return out


def test_a_fresh_critic_values_every_state_at_zero_laid_out_like_tokens(critic) -> None:
    ss = make_samples(3, seed=1)
    values = critic.values(ss)
    assert [len(v) for v in values] == [len(s["tokens"]) for s in ss]
    assert all(x == 0.0 for v in values for x in v)  # zero-initialised head


def test_the_critic_learns_returns_and_values_are_causal(critic, tmp_path) -> None:
    ss = targets(make_samples(12, seed=2, max_len=24))
    first = critic.train_step(ss)
    for _ in range(25):
        last = critic.train_step(ss)
    assert last["value_mse"] < 0.5 * first["value_mse"], (first, last)
    assert last["value_tokens"] == first["value_tokens"] > 0
    values = critic.values(ss)
    odd = [v for s, vs in zip(ss, values) if s["tokens"][0] % 2 for v, m in zip(vs, s["loss_mask"]) if m]
    even = [v for s, vs in zip(ss, values) if not s["tokens"][0] % 2 for v, m in zip(vs, s["loss_mask"]) if m]
    assert sum(odd) / len(odd) > sum(even) / len(even) + 0.3
    # the value of a state depends on the tokens before it only
    cut = {**ss[0], "tokens": ss[0]["tokens"][:10], "loss_mask": ss[0]["loss_mask"][:10]}
    assert critic.values([cut])[0] == pytest.approx(values[0][:10], abs=1e-5)
    # a checkpoint gives back the same values after more training moved them
    saved = critic.save_checkpoint(str(tmp_path / "critic"))
    before = critic.values(ss[:2])
    critic.train_step([{**s, "returns": [0.0] * len(s["tokens"])} for s in ss])
    assert critic.values(ss[:2]) != before
    critic.load_checkpoint(saved)
    assert all(a == pytest.approx(b, abs=1e-6) for a, b in zip(critic.values(ss[:2]), before))


def test_value_clipping_bounds_how_far_one_batch_moves_a_value(critic) -> None:
    critic.value_clip = 0.05
    try:
        ss = targets(make_samples(4, seed=3, max_len=16))
        old = critic.values(ss)
        far = [{**s, "values": v, "returns": [100.0 if m else 0.0 for m in s["loss_mask"]]} for s, v in zip(ss, old)]
        stats = critic.train_step(far)
        assert stats["value_clip_fraction"] == 0.0  # first pass: V == V_old, nothing clipped yet
        for _ in range(5):
            stats = critic.train_step(far)
        assert stats["value_clip_fraction"] > 0.5  # the values passed the clip: their gradient stops
    finally:
        critic.value_clip = None


def test_bad_critic_samples_are_named() -> None:
    c = Critic(rank=0, world_size=1, master_addr="127.0.0.1", master_port=0, model="unused")
    with pytest.raises(LearnerError, match="not set up"):
        c.values([])
    with pytest.raises(ConfigError, match="value_clip"):  # a setting, as the learner's: ConfigError
        Critic(rank=0, world_size=1, master_addr="127.0.0.1", master_port=0, model="x", value_clip=0.0)


# ---------------------------------------------------------------- the stage
class _Group:
    """A critic group double: records calls, values every action token at 0.25."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def call(self, method: str, *args: Any, what: str, **kwargs: Any) -> list[Any]:
        self.calls.append(method)
        if method == "values":
            return [[[0.25 * m for m in s["loss_mask"]] for s in args[0]]]
        return [{"value_loss": 0.1}]


def test_stage_values_then_gae_and_warm_up_freezes_the_policy() -> None:
    group = _Group()
    stage = CriticStage(group=group, settings=GaeSettings(normalize=False, lam=1.0), warmup_steps=2)
    ss = [sample([1, 2, 3], [0, 1, 1], 1.0, "g/0")]
    out, stats = asyncio.run(stage.advantages(ss, 0))
    assert out[0]["advantages"] == pytest.approx([0.0, 0.75, 0.75])
    assert asyncio.run(stage.train(out, 0)) == {"value_loss": 0.1}
    assert group.calls == ["values", "train_step"]
    assert [stage.policy_frozen(v) for v in (0, 1, 2, 3)] == [True, True, False, False]
