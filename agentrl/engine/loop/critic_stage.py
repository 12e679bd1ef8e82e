"""PPO's critic inside the RL loop: values at training time, GAE, and the critic's own update.

For each batch the loop calls, in order:

1. :meth:`CriticStage.advantages`: the critic group computes the value of every action token of
   the batch *now* (at training time, with the critic's current weights, whatever version
   sampled the tokens: the staleness bound applies to the samples as for any estimator), and
   :func:`gae_samples` turns rewards and values into per-token advantages and returns;
2. the policy's ``train_step`` and :meth:`CriticStage.train` at the same time (two groups of
   ranks, each its own processes). During the first ``warmup_steps`` steps the policy is left
   as it is (its version still advances, publishing the same weights, so that the staleness
   window keeps moving) while the critic learns the values of the starting policy.

:func:`gae_samples` is pure (no Ray): samples and values in, samples with ``advantages``,
``returns`` and ``values`` per token out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["CriticStage", "GaeSettings", "gae_samples"]


@dataclass(frozen=True)
class GaeSettings:
    """GAE's numbers (the recipe's ``[algo]`` values)."""

    gamma: float = 1.0
    """Discount per action token (1: no discount, the usual choice for episode-level rewards)."""
    lam: float = 0.95
    """GAE's lambda: 1 gives ``R - V`` (unbiased, noisy), 0 the one-step TD error (biased by the
    critic, low variance)."""
    normalize: bool = True
    """Whiten the advantages over the batch's action tokens (mean 0, std 1)."""


def gae_samples(
    samples: list[dict[str, Any]], values: list[list[float]], settings: GaeSettings
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """New samples with per-token ``advantages``, ``returns`` and ``values`` (0.0 off the action
    tokens), and the batch's critic statistics.

    Each sample needs ``tokens``, ``loss_mask``, ``reward`` (its episode's reward) and ``id``;
    samples whose ids share the part before ``#`` are segments of one episode
    (:func:`agentrl.engine.loop.batching.batch_samples`), and GAE runs over the action tokens of all
    its segments in order, the reward on the last one. ``values[i]`` is laid out like
    ``samples[i]["tokens"]`` (:meth:`agentrl.engine.training.critic.Critic.values`). Position 0 of a
    sample is never an action (nothing predicts it).

    Statistics: ``value_mean``, ``return_mean``, ``gae_advantage_mean`` (before whitening),
    ``advantage_abs_mean`` (after it),
    ``value_explained_variance`` (``1 - Var(R - V) / Var(R)`` over action tokens: 1 is a perfect
    critic, 0 no better than a constant, below 0 worse).
    """
    import torch

    from agentrl.algos.gae import gae_advantages, whiten

    if len(values) != len(samples):
        raise ValueError(f"{len(values)} value lists for {len(samples)} samples")
    episodes: dict[str, list[int]] = {}
    for i, s in enumerate(samples):
        episodes.setdefault(str(s.get("id", i)).split("#")[0], []).append(i)
    positions: list[list[tuple[int, int]]] = []  # per episode: (sample, token) of each action token
    for members in episodes.values():
        pos = [(i, t) for i in members for t in range(1, len(samples[i]["tokens"])) if samples[i]["loss_mask"][t]]
        positions.append(pos)
    out = [dict(s, advantages=[0.0] * len(s["tokens"]), returns=[0.0] * len(s["tokens"]),
                values=[0.0] * len(s["tokens"])) for s in samples]
    longest = max((len(p) for p in positions), default=0)
    if longest == 0:
        return out, {"value_mean": 0.0, "return_mean": 0.0, "gae_advantage_mean": 0.0, "advantage_abs_mean": 0.0,
                     "value_explained_variance": 0.0}
    E = len(positions)
    rewards = torch.zeros((E, longest), dtype=torch.float64)
    vals = torch.zeros((E, longest), dtype=torch.float64)
    mask = torch.zeros((E, longest), dtype=torch.bool)
    for e, pos in enumerate(positions):
        for j, (i, t) in enumerate(pos):
            vals[e, j] = float(values[i][t])
            mask[e, j] = True
        if pos:
            rewards[e, len(pos) - 1] = float(samples[pos[-1][0]]["reward"])
    adv, ret = gae_advantages(rewards, vals, mask, settings.gamma, settings.lam)
    raw_mean = float(adv[mask].mean())
    if settings.normalize:
        adv = whiten(adv, mask)
    r_m, v_m = ret[mask], vals[mask]
    var_r = float(r_m.var(unbiased=False))
    explained = 1.0 - float((r_m - v_m).var(unbiased=False)) / var_r if var_r > 1e-12 else 0.0
    for e, pos in enumerate(positions):
        for j, (i, t) in enumerate(pos):
            out[i]["advantages"][t] = float(adv[e, j])
            out[i]["returns"][t] = float(ret[e, j])
            out[i]["values"][t] = float(vals[e, j])
    stats = {
        "value_mean": float(v_m.mean()),
        "return_mean": float(r_m.mean()),
        "gae_advantage_mean": raw_mean,
        "advantage_abs_mean": float(adv[mask].abs().mean()),
        "value_explained_variance": explained,
    }
    return out, stats


class CriticStage:
    """The critic group's part of a learner step (see the module docstring).

    ``group``: a :class:`~agentrl.engine.training.learner_group.LearnerGroup` of
    :class:`~agentrl.engine.training.critic.Critic` ranks; ``settings``: GAE's numbers; ``warmup_steps``:
    learner steps (versions) during which only the critic trains."""

    def __init__(self, *, group: Any, settings: GaeSettings, warmup_steps: int = 0) -> None:
        self.group = group
        self.settings = settings
        self.warmup_steps = warmup_steps

    def policy_frozen(self, version: int) -> bool:
        """Whether the step that trains on top of ``version`` leaves the policy as it is (warm-up)."""
        return version < self.warmup_steps

    async def advantages(self, samples: list[dict[str, Any]], version: int) -> tuple[list[dict[str, Any]], dict[str, float]]:
        """The batch's values (the critic's weights now) and its GAE samples and statistics."""
        if not samples:
            return samples, {}
        values = (await self.group.call("values", samples, what=f"critic values for step {version + 1}"))[0]
        return gae_samples(samples, values, self.settings)

    async def train(self, samples: list[dict[str, Any]], version: int) -> dict[str, float]:
        """One critic step on GAE samples; its metrics (rank 0's, summed over ranks)."""
        return (await self.group.call("train_step", samples, what=f"critic step {version + 1}"))[0]
