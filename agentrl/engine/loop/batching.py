"""A batch of finished groups → the learner's samples and the step's statistics.

Pure functions: trajectories in, plain dictionaries out (no Ray, no recipe).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from agentrl.engine.common.trajectory import AGENT_FAILURE, Trajectory, episode_time_means

__all__ = ["FAILED", "SOLVED", "BatchSettings", "batch_samples", "no_signal_reason", "staleness_histogram"]

SOLVED = "solved"
"""A group set aside because every episode earned at least ``BatchSettings.solved_reward``."""
FAILED = "failed"
"""A group set aside because its episodes' rewards were equal and below ``solved_reward``."""


@dataclass(frozen=True)
class BatchSettings:
    """How rewards become advantages (the recipe's ``[algo]`` values)."""

    advantage: str = "grpo"
    """The advantage estimator's name (``agentrl.algos.compute_advantages``), or ``gae``: the
    samples then carry their rewards and a critic (:mod:`agentrl.engine.loop.critic_stage`) gives
    them per-token advantages."""
    dynamic_sampling: str = "off"
    """DAPO's dynamic sampling (:mod:`agentrl.algos.dynamic_sampling`): ``off``, ``drop`` (groups
    whose rewards are all equal are dropped from the batch, which shrinks) or ``refill`` (the
    staleness queue sets them aside before batching, :func:`no_signal_reason`, and fills the
    batch from later groups; a batch still drops any such group it meets)."""
    solved_reward: float = 1.0
    """Under refill, a group set aside whose every episode earned at least this reward is
    *solved*; any other is *failed*."""
    overlong_max_tokens: int | None = None
    """Episodes longer than this (generated tokens) are penalised; None: no penalty."""
    overlong_buffer_tokens: int = 0
    """Length of the soft band before ``overlong_max_tokens`` where the penalty ramps up."""

    @property
    def filter_zero_variance_groups(self) -> bool:
        """Whether a batch drops groups whose rewards are all equal (``drop`` and ``refill``)."""
        return self.dynamic_sampling != "off"


def batch_samples(batch: list[list[Trajectory]], settings: BatchSettings) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Training samples of a batch of groups and the batch's statistics.

    Trainable episodes only; rewards with the overlong penalty (when set); zero-variance groups
    dropped (when set); advantages by ``settings.advantage`` over the groups that remain. Each
    sample is a dict with ``tokens``, ``loss_mask``, ``behaviour_logprobs``, ``advantage``,
    ``reward`` (the episode's, with the overlong penalty), ``versions`` and ``id`` (the
    trajectory's ``sample_id``); an episode of several segments gives one sample per segment
    (:attr:`Trajectory.segment_starts`), all with its advantage. With ``advantage = "gae"`` the
    advantage is 0.0 here: the critic stage replaces it with per-token ``advantages``."""
    import torch

    from agentrl.algos import compute_advantages, nonzero_variance_mask

    kept = [t for g in batch for t in g if t.trainable]
    group = torch.tensor([gi for gi, g in enumerate(batch) for t in g if t.trainable], dtype=torch.long)
    rewards, penalty = _penalised_rewards(kept, settings)
    if settings.filter_zero_variance_groups and kept:
        keep = nonzero_variance_mask(rewards, group)
    else:
        keep = torch.ones(len(kept), dtype=torch.bool)
    dropped_groups = len(set(group[~keep].tolist()))
    idx = keep.nonzero().flatten().tolist()
    if settings.advantage == "gae":  # per token, from the critic's values at training time
        advs = [0.0] * len(idx)
    else:
        advs = compute_advantages(rewards[idx], group[idx], settings.advantage).tolist() if idx else []
    samples = [sample for i, adv in zip(idx, advs) for sample in _samples_of(kept[i], adv, float(rewards[i]))]
    flat = [t for g in batch for t in g]
    n = max(1, len(flat))
    trained_ids = {s["id"].split("#")[0] for s in samples if any(s["loss_mask"])}
    groups = [[t for t in g if t.trainable] for g in batch]
    stats = {
        "reward_mean": sum(t.reward for t in kept) / max(1, len(kept)),
        "samples": len(flat),
        "infra_failures_batch": sum(t.status != AGENT_FAILURE for t in flat) - len(kept),
        "agent_failures_batch": sum(t.status == AGENT_FAILURE for t in flat),
        # episodes a judge, reward model or reward function could not score (engine.rewards.scoring): among the infra failures
        "reward_failures_batch": sum(1 for t in flat if t.info.get("reward_failure")),
        **_reward_part_means(kept),
        "status": dict(Counter(t.status for t in flat)),
        "turns_mean": sum(t.metrics.get("turns", 0) for t in flat) / n,
        "tool_calls_mean": sum(t.metrics.get("tool_calls", 0) for t in flat) / n,
        "tool_errors_mean": sum(t.metrics.get("tool_errors", 0) for t in flat) / n,
        "generated_tokens_mean": sum(t.num_generated for t in flat) / n,
        **episode_time_means(flat),
        "max_token_version": max((t.newest_version or 0) for t in flat) if flat else 0,
        "zero_variance_groups_dropped": dropped_groups,
        "samples_trained": len(trained_ids),
        "trained_tokens_batch": sum(sum(s["loss_mask"]) for s in samples),
        "zero_variance_groups": sum(1 for g in groups if g and len({t.reward for t in g}) == 1),
        "groups": sum(1 for g in groups if g),
        "overflow_before_generating": sum(1 for t in flat if t.status == "overflow" and t.num_generated == 0),
        "overflow_prompt_tokens": max((len(t.tokens) for t in flat if t.status == "overflow" and t.num_generated == 0), default=0),
        "overlong_penalty_mean": float(penalty.mean()) if kept else 0.0,
        "advantage_abs_mean": sum(abs(x) for x in advs) / max(1, len(advs)),
    }
    return samples, stats


def _penalised_rewards(kept: list[Trajectory], settings: BatchSettings) -> tuple[Any, Any]:
    """The rewards of ``kept`` with the overlong penalty (when set) and the penalty, float64 tensors."""
    import torch

    from agentrl.algos import overlong_penalty

    rewards = torch.tensor([float(t.reward) for t in kept], dtype=torch.float64)
    penalty = torch.zeros_like(rewards)
    if settings.overlong_max_tokens is not None and kept:
        lengths = torch.tensor([t.num_generated for t in kept])
        penalty = overlong_penalty(lengths, settings.overlong_max_tokens, settings.overlong_buffer_tokens)
    return rewards + penalty, penalty


def no_signal_reason(group: list[Trajectory], settings: BatchSettings) -> str | None:
    """None when ``group`` carries a learning signal for a group-relative estimator: the rewards
    of its trainable episodes (with the overlong penalty, as :func:`batch_samples` computes them)
    are not all equal. Else why not: :data:`SOLVED` when every trainable episode earned at least
    ``settings.solved_reward`` (the raw reward, before the penalty), :data:`FAILED` otherwise (a
    group with one trainable episode has no signal either). The staleness queue's ``classify``
    under refill."""
    from agentrl.algos import nonzero_variance_mask

    kept = [t for t in group if t.trainable]
    if not kept:
        return FAILED
    rewards, _ = _penalised_rewards(kept, settings)
    if bool(nonzero_variance_mask(rewards).any()):
        return None
    return SOLVED if all(float(t.reward) >= settings.solved_reward for t in kept) else FAILED


def _samples_of(t: Trajectory, advantage: float, reward: float) -> list[dict[str, Any]]:
    """The learner samples of one episode: one per segment that holds a trained token, each with
    the episode's advantage (ids ``<sample_id>`` for a one-segment episode, else ``<sample_id>#k``)."""
    segments = t.segments()
    out = []
    for k, (a, b) in enumerate(segments):
        if len(segments) > 1 and not any(t.loss_mask[a:b]):
            continue
        out.append({
            "tokens": t.tokens[a:b],
            "loss_mask": t.loss_mask[a:b],
            "behaviour_logprobs": t.behaviour_logprobs[a:b],
            "advantage": advantage,
            "reward": reward,
            "versions": t.versions[a:b],
            "id": t.sample_id if len(segments) == 1 else f"{t.sample_id}#{k}",
        })
    return out


def _reward_part_means(kept: list[Trajectory]) -> dict[str, float]:
    """``<part>_mean`` of each reward part the scorer kept (``env_reward``, ``judge_score``,
    ``rm_score``, ``fn/<function>``: :mod:`agentrl.engine.rewards.scoring`) over the episodes that
    have it; none without one."""
    out = {}
    functions = sorted({k for t in kept for k in t.metrics if k.startswith("fn/")})
    for part in ("env_reward", "judge_score", "rm_score", *functions):
        values = [t.metrics[part] for t in kept if part in t.metrics]
        if values:
            out[f"{part}_mean"] = sum(values) / len(values)
    return out


def staleness_histogram(batch: list[list[Trajectory]], version: int) -> dict[str, int]:
    """How many episodes of ``batch`` are 0, 1, 2... versions behind ``version`` (by their
    oldest token; an episode that wrote nothing counts as 0)."""
    return dict(Counter(
        str(version - (t.oldest_version if t.oldest_version is not None else version)) for g in batch for t in g
    ))
