"""Degenerate steps and evaluations, said in words: what went wrong, the likely cause, the recipe
key to change.

A step is *degenerate* when it cannot teach the model anything:

- every episode ran out of ``rollout.max_episode_tokens`` before the model wrote a token (the
  prompt alone is too long);
- every episode failed (infrastructure or agent program);
- no token was trained (nothing generated, or every group filtered out);
- every group's rewards were equal: zero advantages everywhere, so no learning signal;
- under refill (``algo.dynamic_sampling = "refill"``), no group sampled within the budget had a
  learning signal, and at least one of them was not solved (a budget of solved groups only is no
  degenerate step: the loop ends the run there as a success, the task mastered).

Pure functions over the statistics of :func:`agentrl.engine.loop.batching.batch_samples` and
:func:`agentrl.engine.loop.evaluation.summarise`; the loop logs the message and stops the run after
``learner.max_degenerate_steps`` degenerate steps in a row.
"""

from __future__ import annotations

from typing import Any

__all__ = ["diagnose_step", "diagnose_eval"]


def _overflow(n: int, prompt_tokens: int, limit: int | None, what: str) -> str:
    shown = f"rollout.max_episode_tokens={limit}" if limit is not None else "rollout.max_episode_tokens"
    return (
        f"all {n} {what} exceeded {shown} before the first turn: the prompt is {prompt_tokens} tokens. "
        "Raise rollout.max_episode_tokens (and generator.max_model_len), or shorten the system prompt and tool schemas"
    )


def diagnose_step(stats: dict[str, Any], *, max_episode_tokens: int | None = None) -> str | None:
    """Why a learner step with batch statistics ``stats`` is degenerate, or None when it is not."""
    n = int(stats.get("samples", 0))
    if n and stats.get("overflow_before_generating", 0) == n:
        return _overflow(n, int(stats.get("overflow_prompt_tokens", 0)), max_episode_tokens, "episodes")
    failed = int(stats.get("infra_failures_batch", 0)) + int(stats.get("agent_failures_batch", 0))
    if n and failed == n:
        return (f"every one of the {n} episodes failed ({stats.get('infra_failures_batch', 0)} on infrastructure, "
                f"{stats.get('agent_failures_batch', 0)} in the agent program): see samples.jsonl and logs/")
    sampled = int(stats.get("groups_sampled", 0))
    if sampled and not stats.get("groups", 0):  # refill: the budget found no group with a learning signal
        failed, solved = int(stats.get("set_aside_failed", 0)), int(stats.get("set_aside_solved", 0))
        hard = "too hard" if not solved else ("solved" if not failed else "too hard on some prompts and solved on the others")
        return (f"none of the {sampled} groups sampled for this step had a learning signal ({failed} with equal rewards "
                f"below the solved reward, {solved} solved): every group had equal rewards, the sampling budget "
                f"(algo.max_sampling_factor) is spent and the weights are held. The task is {hard} for the model as it "
                "samples: warm it up with [sft], raise rollout.group_size or rollout.temperature, or give partial credit in the reward")
    if stats.get("trained_tokens_batch", 1) == 0:
        return (f"no token was trained in this step ({n} episodes, {stats.get('generated_tokens_mean', 0.0):.1f} generated tokens "
                "per episode): the model wrote nothing that reached the loss. Check rollout.max_new_tokens, "
                "rollout.max_episode_tokens and algo.dynamic_sampling")
    groups = int(stats.get("groups", 0))
    if groups and stats.get("zero_variance_groups", 0) == groups and not stats.get("advantage_abs_mean", 0.0):
        # (a critic's advantages, R - V, carry signal even when every group's rewards are equal)
        return (f"every one of the {groups} groups had equal rewards (mean reward {stats.get('reward_mean', 0.0):.3f}): "
                "zero advantages, no learning signal. The task is too hard or too easy for the model as it samples: "
                "warm it up with [sft], raise rollout.group_size or rollout.temperature, or give partial credit in the reward")
    return None


def diagnose_eval(metrics: dict[str, float]) -> str | None:
    """Why an evaluation with ``metrics`` (:func:`agentrl.engine.loop.evaluation.summarise`) is
    degenerate, or None when it is not."""
    total = int(metrics.get("episodes", 0) + metrics.get("infra_failures", 0) + metrics.get("agent_failures", 0))
    if total and metrics.get("overflow_before_generating", 0) == total:
        return _overflow(total, int(metrics.get("overflow_prompt_tokens", 0)), None, "evaluation episodes")
    if total and metrics.get("episodes", 0) == 0:
        return (f"every one of the {total} evaluation episodes failed ({int(metrics.get('infra_failures', 0))} on infrastructure, "
                f"{int(metrics.get('agent_failures', 0))} in the agent program): see eval_samples.jsonl and logs/")
    return None
