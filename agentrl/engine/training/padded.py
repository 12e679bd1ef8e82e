"""A micro-batch of token rows padded to its longest: the model's inputs and per-target tensors.

Shared by the learner and the critic. Per-target tensors are ``[B, T-1]``: position ``t`` is
about token ``t + 1`` (what the hidden state at ``t`` predicts or values), and ``select`` marks
the targets whose ``loss_mask`` is 1.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["PaddedBatch"]


class PaddedBatch:
    """``rows`` (dicts with ``tokens`` and ``loss_mask``) padded with ``pad_id``, on ``device``.

    ``ids``, ``attn``: ``[B, T]`` model inputs; ``select``: ``[B, T-1]`` booleans, the trained
    targets; ``real_tokens``: tokens that are not padding; ``slots``: ``B * T``."""

    def __init__(self, rows: list[dict[str, Any]], pad_id: int, device: torch.device) -> None:
        self.rows, self.device = rows, device
        self.longest = max(len(r["tokens"]) for r in rows)
        B = len(rows)
        ids = torch.full((B, self.longest), pad_id, dtype=torch.long)
        attn = torch.zeros((B, self.longest), dtype=torch.long)
        mask = torch.zeros((B, self.longest), dtype=torch.bool)
        for b, r in enumerate(rows):
            n = len(r["tokens"])
            ids[b, :n] = torch.as_tensor(r["tokens"], dtype=torch.long)
            attn[b, :n] = 1
            mask[b, :n] = torch.as_tensor(r["loss_mask"]) > 0
        self.ids, self.attn = ids.to(device), attn.to(device)
        self.select = mask[:, 1:].to(device)
        self.real_tokens = int(attn.sum())
        self.slots = B * self.longest

    def per_target(
        self, values_of: Callable[[dict[str, Any]], Sequence[float] | None], dtype: torch.dtype = torch.float32, fill: float = 0.0
    ) -> torch.Tensor:
        """``[B, T-1]`` tensor of a per-token list of each row (``values_of(row)``, laid out like
        its tokens; None: ``fill`` for the whole row), shifted to targets."""
        out = torch.full((len(self.rows), self.longest), fill, dtype=dtype)
        for b, r in enumerate(self.rows):
            values = values_of(r)
            if values is not None:
                out[b, : len(r["tokens"])] = torch.as_tensor(values, dtype=dtype)
        return out[:, 1:].to(self.device)

    def pad(self, flat: torch.Tensor) -> torch.Tensor:
        """Scatter a flat tensor over the selected positions into ``[B, T-1]`` (zeros elsewhere)."""
        return torch.zeros(self.select.shape, dtype=flat.dtype, device=flat.device).masked_scatter(self.select, flat)
