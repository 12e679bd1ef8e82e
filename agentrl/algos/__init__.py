"""Advantage estimators and policy losses: small pure functions over tensors, one per file.

Nothing here knows about Ray, vLLM or environments; each function's docstring gives its formula.

- advantages: :mod:`~agentrl.algos.grpo`, :mod:`~agentrl.algos.dr_grpo`, :mod:`~agentrl.algos.rloo`,
  :mod:`~agentrl.algos.reinforce_pp` (chosen by name in :mod:`~agentrl.algos.advantages`);
  :mod:`~agentrl.algos.dynamic_sampling` (zero-variance groups), :mod:`~agentrl.algos.overlong`;
  :mod:`~agentrl.algos.gae` (per-token advantages from a critic's values, PPO) and
  :mod:`~agentrl.algos.value_loss` (the critic's clipped loss).
- policy losses: :mod:`~agentrl.algos.ppo` (clip-higher, dual clip), :mod:`~agentrl.algos.gspo`;
  :mod:`~agentrl.algos.aggregation` (token-mean, seq-mean-token-sum, seq-mean-token-mean).
- off-policy corrections: :mod:`~agentrl.algos.decoupled` (proximal policy),
  :mod:`~agentrl.algos.tis` (truncated importance sampling), :mod:`~agentrl.algos.ratio_mask`.
- :mod:`~agentrl.algos.kl`: KL estimators against a reference model.
- :mod:`~agentrl.algos.objective`: :class:`ObjectiveSettings` + :func:`policy_loss`, the one
  entry point the learner calls.
"""

from agentrl.algos.advantages import ESTIMATORS, compute_advantages, group_advantages
from agentrl.algos.aggregation import AGGREGATION_MODES, aggregate_loss
from agentrl.algos.decoupled import decoupled_ppo_token_loss
from agentrl.algos.dr_grpo import dr_grpo_advantages
from agentrl.algos.dynamic_sampling import nonzero_variance_mask
from agentrl.algos.gae import gae_advantages, whiten
from agentrl.algos.grpo import grpo_advantages
from agentrl.algos.gspo import gspo_ratio, sequence_mean
from agentrl.algos.kl import kl_penalty
from agentrl.algos.objective import STAT_KEYS, ObjectiveSettings, policy_loss
from agentrl.algos.overlong import overlong_penalty
from agentrl.algos.ppo import ppo_clip_loss, ppo_clip_token_loss
from agentrl.algos.ratio_mask import ratio_band_mask
from agentrl.algos.reinforce_pp import reinforce_pp_advantages
from agentrl.algos.rloo import rloo_advantages
from agentrl.algos.tis import truncated_is_weight
from agentrl.algos.value_loss import clipped_value_loss

__all__ = [
    "AGGREGATION_MODES",
    "ESTIMATORS",
    "STAT_KEYS",
    "ObjectiveSettings",
    "aggregate_loss",
    "clipped_value_loss",
    "compute_advantages",
    "decoupled_ppo_token_loss",
    "dr_grpo_advantages",
    "gae_advantages",
    "group_advantages",
    "grpo_advantages",
    "gspo_ratio",
    "kl_penalty",
    "nonzero_variance_mask",
    "overlong_penalty",
    "policy_loss",
    "ppo_clip_loss",
    "ppo_clip_token_loss",
    "ratio_band_mask",
    "reinforce_pp_advantages",
    "rloo_advantages",
    "sequence_mean",
    "truncated_is_weight",
    "whiten",
]
