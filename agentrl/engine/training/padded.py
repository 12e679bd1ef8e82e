"""A micro-batch of token rows padded to its longest (or packed into one row): the model's inputs
and per-target tensors; :class:`RLBatch` adds the learner's RL targets.

Shared by the learner and the critic. Per-target tensors are ``[B, T-1]``: position ``t`` is
about token ``t + 1`` (what the hidden state at ``t`` predicts or values), and ``select`` marks
the targets whose ``loss_mask`` is 1.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from agentrl.engine.training.shared_prefix import SharedRows, Sharing, units_of

__all__ = ["PaddedBatch", "RLBatch"]


class PaddedBatch:
    """``rows`` (dicts with ``tokens`` and ``loss_mask``) padded with ``pad_id``, on ``device``.

    ``ids``, ``attn``: ``[B, T]`` model inputs; ``select``: ``[B, T-1]`` booleans, the trained
    targets; ``real_tokens``: tokens that are not padding; ``slots``: ``B * T``.

    ``packed``: the model's inputs are the rows laid end to end in one row instead, with no
    padding: ``ids`` is ``[1, N]`` (``N`` = the rows' tokens), ``attn`` None, ``position_ids``
    restart at 0 at each row (transformers then keeps every token's attention inside its own
    row: flash attention runs each row on its own, other implementations mask the rest), and
    ``model_select`` is ``[1, N-1]``: a row's trained targets, never a next row's first token.
    Its selected positions come in the same order as ``select``'s, so :meth:`pad` and
    :meth:`per_target` (``[B, T-1]``, padded as always: the loss's layout) are unchanged.
    ``slots`` is then ``N``. Not packed: ``position_ids`` is None and ``model_select`` is ``select``.

    ``sharing`` (not with ``packed``): the samples that share a prompt are laid out in units, one
    row each (:mod:`agentrl.engine.training.shared_prefix`): ``ids`` and ``position_ids`` are
    ``[U, N]``, ``attn`` the ``[U, 1, N, N]`` mask, and the selected targets are
    ``hidden_index`` (each one's hidden state in the flattened ``[U * N]`` rows) and ``targets``
    (its token), in ``select``'s order; ``real_tokens`` are then the rows' tokens (a shared
    prefix counted once), ``slots`` ``U * N``. Otherwise both are None."""

    def __init__(
        self, rows: list[dict[str, Any]], pad_id: int, device: torch.device, packed: bool = False, sharing: Sharing | None = None,
    ) -> None:
        self.rows, self.device = rows, device
        self.longest = max(len(r["tokens"]) for r in rows)
        B = len(rows)
        lengths = [len(r["tokens"]) for r in rows]
        tokens = [torch.as_tensor(r["tokens"], dtype=torch.long) for r in rows]
        mask = torch.zeros((B, self.longest), dtype=torch.bool)
        for b, (r, n) in enumerate(zip(rows, lengths)):
            mask[b, :n] = torch.as_tensor(r["loss_mask"]) > 0
        self.select = mask[:, 1:].to(device)
        self.real_tokens = sum(lengths)
        self.packed = packed
        self.position_ids: torch.Tensor | None = None
        self.hidden_index: torch.Tensor | None = None
        self.targets: torch.Tensor | None = None
        if sharing is not None:
            self._share(tokens, mask, pad_id, sharing)
            return
        if not packed:
            ids = torch.full((B, self.longest), pad_id, dtype=torch.long)
            attn = torch.zeros((B, self.longest), dtype=torch.long)
            for b, (t, n) in enumerate(zip(tokens, lengths)):
                ids[b, :n] = t
                attn[b, :n] = 1
            self.ids, self.attn = ids.to(device), attn.to(device)
            self.model_select = self.select
            self.slots = B * self.longest
            return
        self.ids = torch.cat(tokens)[None].to(device)
        self.attn = None
        self.position_ids = torch.cat([torch.arange(n) for n in lengths])[None].to(device)
        boundary = torch.zeros(1, dtype=torch.bool)  # a row's last token does not predict the next row's first
        parts = [p for b, n in enumerate(lengths) for p in (mask[b, 1:n], boundary)][:-1]
        self.model_select = torch.cat(parts)[None].to(device)
        self.slots = self.real_tokens

    def _share(self, tokens: list[torch.Tensor], mask: torch.Tensor, pad_id: int, sharing: Sharing) -> None:
        """The model's inputs in units (:mod:`agentrl.engine.training.shared_prefix`); the
        selected targets' hidden-state indices and tokens, in :attr:`select`'s order."""
        listed = [t.tolist() for t in tokens]
        units = units_of(listed, [r["loss_mask"] for r in self.rows], sharing.budget, sharing.key_cost)
        layout = SharedRows(listed, units, pad_id)
        self.ids = layout.ids.to(self.device)
        self.attn = layout.attention_mask(sharing.attn_implementation, sharing.mask_dtype).to(self.device)
        self.position_ids = layout.position_ids.to(self.device)
        index, targets = [], []
        for b, t in enumerate(tokens):
            positions = torch.nonzero(mask[b, 1 : len(t)], as_tuple=True)[0]  # position t predicts token t + 1
            index.append(layout.hidden_index(b, positions))
            targets.append(t[positions + 1])
        self.hidden_index = torch.cat(index).to(self.device)
        self.targets = torch.cat(targets).to(self.device)
        self.model_select = self.select
        self.slots = layout.slots
        self.real_tokens = layout.real_tokens

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


class RLBatch(PaddedBatch):
    """One RL (or SFT) micro-batch of the learner: :class:`PaddedBatch` plus the behaviour log-probs, the
    weight versions and the advantages of each target (a sample's scalar ``advantage`` on every
    token, or its per-token ``advantages``); zeros (versions -1) when ``with_rl`` is False."""

    def __init__(
        self, rows: list[dict[str, Any]], pad_id: int, device: torch.device, with_rl: bool, packed: bool = False,
        sharing: Sharing | None = None,
    ) -> None:
        super().__init__(rows, pad_id, device, packed, sharing)

        def advantages(r: dict[str, Any]) -> list[float]:
            a = r.get("advantages")
            return list(a) if a is not None else [float(r["advantage"])] * len(r["tokens"])

        self.behaviour = self.per_target(lambda r: r["behaviour_logprobs"] if with_rl else None)
        self.versions = self.per_target(lambda r: r.get("versions") if with_rl else None, torch.long, -1)
        self.advantages = self.per_target(advantages if with_rl else lambda r: None)
