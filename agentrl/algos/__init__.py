"""Advantage estimators and policy losses: small pure functions over tensors, one per file.

Nothing here knows about Ray, vLLM or environments; each function's docstring gives its formula.
"""

from agentrl.algos.advantages import dr_grpo_advantages, grpo_advantages, group_advantages
from agentrl.algos.ppo import ppo_clip_loss

__all__ = ["grpo_advantages", "dr_grpo_advantages", "group_advantages", "ppo_clip_loss"]
