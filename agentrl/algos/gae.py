"""Generalised advantage estimation (Schulman et al., 2016) over the model's tokens of an episode.

An LLM episode is a sequence of tokens of which only some are *actions*: the tokens the model
wrote (``mask = 1``). Prompt, tool output and chat-template glue are the environment's part of a
transition; they carry no action, no reward and no value target. The recursion therefore runs
over the action tokens alone, in order, skipping every other position::

    j, j' = consecutive action tokens (j' the next one; none after the last)
    delta_j = r_j + gamma * V_j' - V_j          (V after the last action token = 0: terminal)
    A_j     = delta_j + gamma * lam * A_j'
    R_j     = A_j + V_j                         (the value target, "returns")

``gamma`` and ``lam`` apply once per action token: a tool call and its output cost no extra
discount, and a tool output that is long or short changes nothing. ``V_j`` is the critic's value
of the state *before* token ``j`` is written. Rewards sit on action tokens (the episode reward on
its last one); with ``gamma = lam = 1`` every action token's advantage is ``R - V_j``.
"""

from __future__ import annotations

import torch

__all__ = ["gae_advantages", "whiten"]


def gae_advantages(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0, lam: float = 0.95
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(advantages, returns)``, both ``[B, T]`` and zero where ``mask`` is 0.

    ``rewards``, ``values`` and ``mask`` are ``[B, T]``; each row is one episode (or the action
    tokens of one episode laid end to end). ``rewards`` must be zero off the action tokens.
    Example, one row with action tokens at positions 1 and 3, ``r = (0, 0, 0, 1)``,
    ``V = (·, 0.5, ·, 0.8)``, ``gamma = 1, lam = 0.5``: ``delta_3 = 1 - 0.8 = 0.2``,
    ``A_3 = 0.2``; ``delta_1 = 0 + 0.8 - 0.5 = 0.3``, ``A_1 = 0.3 + 0.5 * 0.2 = 0.4``;
    returns ``R_1 = 0.9, R_3 = 1.0``.
    """
    if not (rewards.shape == values.shape == mask.shape) or rewards.dim() != 2:
        raise ValueError(f"rewards, values and mask must be [B, T] of one shape, got {tuple(rewards.shape)}, "
                         f"{tuple(values.shape)}, {tuple(mask.shape)}")
    if not (0.0 <= gamma <= 1.0 and 0.0 <= lam <= 1.0):
        raise ValueError(f"need 0 <= gamma <= 1 and 0 <= lam <= 1, got gamma={gamma}, lam={lam}")
    m = mask.to(torch.bool)
    if bool((rewards[~m] != 0).any()):
        raise ValueError("rewards must be zero where mask is 0 (put an episode's reward on its last action token)")
    dtype = torch.promote_types(rewards.dtype, values.dtype)
    r, v = rewards.to(dtype), values.to(dtype)
    adv = torch.zeros_like(r)
    next_v = torch.zeros(r.shape[0], dtype=dtype, device=r.device)
    next_a = torch.zeros_like(next_v)
    for t in range(r.shape[1] - 1, -1, -1):
        mt = m[:, t]
        a = r[:, t] + gamma * next_v - v[:, t] + gamma * lam * next_a
        adv[:, t] = torch.where(mt, a, torch.zeros_like(a))
        next_v = torch.where(mt, v[:, t], next_v)
        next_a = torch.where(mt, a, next_a)
    returns = torch.where(m, adv + v, torch.zeros_like(adv))
    return adv, returns


def whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """``(x - mean) / (std + eps)`` over the positions where ``mask`` is 1 (population std); zero
    elsewhere. PPO's advantage normalisation over a batch: keeps the policy step's scale the same
    whatever the rewards' scale. Fewer than 2 positions: centred only."""
    m = mask.to(torch.bool)
    n = int(m.sum())
    if n == 0:
        return torch.zeros_like(x)
    mean = x[m].mean()
    centred = x - mean
    if n < 2:
        return torch.where(m, centred, torch.zeros_like(x))
    std = centred[m].pow(2).mean().sqrt()
    return torch.where(m, centred / (std + eps), torch.zeros_like(x))
