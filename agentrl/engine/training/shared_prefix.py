"""Micro-batches whose samples share a prompt compute it once (``learner.shared_prefixes``).

The samples of a GRPO group start with the same prompt, and in a padded micro-batch every one of
them runs it through the model again: on the calculator tasks the prompt is a third of the tokens.
Here the samples that share a prefix form a *unit*, laid out as one row: the prefix once, then
each sample's remaining tokens (its *suffix*) one after the other::

    row:   [ prefix (P tokens) | suffix of sample 1 | suffix of sample 2 | ... ]
    mask:  prefix tokens attend causally within the prefix; a suffix token attends to the whole
           prefix and causally within its own suffix, never to another sample's suffix
    positions: the prefix 0..P-1; every suffix P, P+1, ... (where its tokens stand in the sample)

so each sample's tokens see exactly what they see in the sample alone, and the model's outputs
for them are the same (up to the float rounding of a different summation order). The hidden
state that predicts a sample's token ``t + 1`` is found in the row where the sample's token ``t``
is: inside the prefix for ``t < P`` (shared), inside the sample's suffix after that.

A micro-batch holds several units, padded to the longest row, with a 4-D attention mask (transformers
passes a 4-D mask to the attention as it is): ``sdpa`` takes it as booleans, ``eager`` as an
additive float mask. Flash attention takes no such mask, so units are not used there (its
variable-length packing is :mod:`agentrl.engine.training.microbatch`'s ``packed`` layout).

Samples belong to one unit when they have the same prompt (the tokens before their first trained
one); the shared prefix is their longest common prefix, at most one token short of the shortest
(every sample keeps a suffix). A unit whose row would exceed the micro-batch budget is cut into
several, in order, and so is one whose row would cost more than its samples apart: the masked
attention over a row is computed whole (:func:`key_cost`), which long samples behind a short
prompt do not repay.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
import torch

from agentrl.errors import ConfigError

__all__ = ["SHARING", "Sharing", "SharedRows", "Unit", "key_cost", "shares_prefixes", "units_of"]

SHARING = ("auto", "on", "off")
"""``learner.shared_prefixes``: ``on`` computes the prefix samples share once per micro-batch
(units, above); ``off`` runs every sample whole; ``auto`` shares where the attention takes a 4-D
mask (``sdpa``, ``eager``) and micro-batches are not packed."""

MASKED_ATTENTION = ("sdpa", "eager")
"""Attention implementations that take a custom 4-D mask (the layout's requirement)."""


def shares_prefixes(setting: str, attn_implementation: str | None, packed: bool) -> bool:
    """Whether micro-batches are laid out in units: ``setting`` is one of :data:`SHARING`,
    ``attn_implementation`` the model's (None: unknown, transformers' default ``sdpa``),
    ``packed`` whether micro-batches are packed (then never: the two layouts exclude each other).

    Raises:
        ConfigError: an unknown ``setting``, or ``on`` with packed micro-batches or an attention
            implementation that takes no custom mask.
    """
    if setting not in SHARING:
        raise ConfigError(f"learner.shared_prefixes must be one of {SHARING}, got {setting!r}")
    if setting == "off":
        return False
    attention = attn_implementation or "sdpa"
    usable = attention in MASKED_ATTENTION and not packed
    if setting == "on" and not usable:
        why = "packed micro-batches" if packed else f"attention {attention!r} (it takes no custom mask; sdpa and eager do)"
        raise ConfigError(f"learner.shared_prefixes = 'on' cannot be used with {why}")
    return usable


def _prompt_length(loss_mask: Sequence[int]) -> int:
    """Tokens before the first trained one (all of them when none is trained)."""
    for i, m in enumerate(loss_mask):
        if i > 0 and m:
            return i
    return len(loss_mask)


def _common_prefix(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    """Length of the longest common prefix of ``a`` and ``b``, at most ``limit``."""
    n = min(len(a), len(b), limit)
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass(frozen=True)
class Sharing:
    """How a rank lays out micro-batches in units: its attention implementation (None: unknown,
    taken as ``sdpa``), the dtype an additive (``eager``) mask is made in, the micro-batch token
    budget a unit's row keeps to (None: none), and ``key_cost``: what attending to one key costs
    a token, as a fraction of the rest of its work in a layer (:func:`key_cost`; 0: attention
    free, sharing always pays)."""

    attn_implementation: str | None
    mask_dtype: torch.dtype = torch.float32
    budget: int | None = None
    key_cost: float = 0.0


def key_cost(hidden_size: int | None) -> float:
    """What attending to one more key costs a token of a decoder of width ``hidden_size``,
    relative to the token's own matrix products in a layer: ``4 d`` FLOPs (scores and values)
    against about ``24 d**2`` (the attention's four projections and a gated MLP of about
    ``8/3 d``), so ``1 / (6 d)``. The masked attention over a unit's row is computed whole, so a
    row of ``n`` tokens costs about ``n * (1 + n * key_cost)``. 0 when the width is unknown."""
    return 1.0 / (6.0 * hidden_size) if hidden_size else 0.0


@dataclass
class Unit:
    """Samples laid out in one row: their indices (in the order given) and the prefix length
    ``prefix`` they share (``>= 1``; a lone sample's is its length less one)."""

    rows: list[int]
    prefix: int

    def length(self, lengths: Sequence[int]) -> int:
        """Tokens of the unit's row: the prefix once, then every sample's suffix (``lengths``:
        every sample's tokens)."""
        return self.prefix + sum(lengths[i] - self.prefix for i in self.rows)

    def length_of(self, tokens: Sequence[Sequence[int]]) -> int:
        """:meth:`length` from the samples themselves."""
        return self.prefix + sum(len(tokens[i]) - self.prefix for i in self.rows)


def units_of(
    tokens: Sequence[Sequence[int]], loss_masks: Sequence[Sequence[int]], budget: int | None = None, key_cost: float = 0.0,
) -> list[Unit]:
    """The units of samples (``tokens[i]``, ``loss_masks[i]``; each at least 2 tokens): samples
    with the same prompt, in order of first appearance. A sample joins the unit being formed
    when the unit's row stays within ``budget`` tokens (None: no bound) and costs no more than
    the unit and the sample apart would (a row of ``n`` tokens costs ``n * (1 + n * key_cost)``:
    long rows with short shared prompts stay apart, their attention over the whole row would
    cost more than the prompt saves); otherwise it begins the next unit. Deterministic: every
    rank, and a micro-batch re-cut from its own samples, finds the same units."""

    def cost(n: int) -> float:
        return n * (1.0 + n * key_cost)

    by_prompt: dict[tuple[int, ...], list[int]] = {}
    for i, (t, m) in enumerate(zip(tokens, loss_masks)):
        by_prompt.setdefault(tuple(t[: _prompt_length(m)]), []).append(i)
    units: list[Unit] = []
    for members in by_prompt.values():
        rows: list[int] = []
        common = shortest = 0
        for i in members:
            n = len(tokens[i])
            if rows:
                c = min(common, _common_prefix(tokens[rows[0]], tokens[i], common))
                s = min(shortest, n)
                p = max(1, min(c, s - 1))
                joined = p + sum(len(tokens[j]) - p for j in rows) + n - p
                apart = cost(Unit(rows, max(1, min(common, shortest - 1))).length_of(tokens)) + cost(n)
                if (budget is None or joined <= budget) and cost(joined) <= apart:
                    rows.append(i)
                    common, shortest = c, s
                    continue
                units.append(Unit(rows, max(1, min(common, shortest - 1))))
            rows, common, shortest = [i], n, n
        units.append(Unit(rows, max(1, min(common, shortest - 1))))
    return units


class SharedRows:
    """The model's inputs for samples ``tokens`` laid out in :func:`units_of`'s units (rows in
    unit order), and where each sample's hidden states are.

    ``ids`` ``[U, N]`` (``pad_id`` after a row's end), ``position_ids`` ``[U, N]``, ``mask``
    ``[U, 1, N, N]`` booleans (True: the query attends to the key; a padding slot attends to
    itself alone), ``real_tokens`` the rows' tokens, ``slots`` ``U * N``. :meth:`hidden_index`
    maps a sample's position to its hidden state's index in the flattened ``[U * N]`` rows."""

    def __init__(self, tokens: Sequence[Sequence[int]], units: list[Unit], pad_id: int) -> None:
        lengths = [len(t) for t in tokens]
        row_lengths = [u.length(lengths) for u in units]
        self.width = N = max(row_lengths)
        U = len(units)
        self.ids = torch.full((U, N), pad_id, dtype=torch.long)
        self.position_ids = torch.zeros((U, N), dtype=torch.long)
        self.mask = torch.zeros((U, 1, N, N), dtype=torch.bool)
        self.real_tokens = sum(row_lengths)
        self.slots = U * N
        self._where: dict[int, tuple[int, int, int]] = {}  # sample -> (unit, prefix, its suffix's first slot)
        for g, unit in enumerate(units):
            P = unit.prefix
            first = tokens[unit.rows[0]]
            self.ids[g, :P] = torch.as_tensor(list(first[:P]), dtype=torch.long)
            self.position_ids[g, :P] = torch.arange(P)
            self.mask[g, 0, :P, :P] = torch.ones(P, P, dtype=torch.bool).tril()
            at = P
            for i in unit.rows:
                s = lengths[i] - P
                self.ids[g, at : at + s] = torch.as_tensor(list(tokens[i][P:]), dtype=torch.long)
                self.position_ids[g, at : at + s] = torch.arange(P, lengths[i])
                self.mask[g, 0, at : at + s, :P] = True
                self.mask[g, 0, at : at + s, at : at + s] = torch.ones(s, s, dtype=torch.bool).tril()
                self._where[i] = (g, P, at)
                at += s
            pad = torch.arange(at, N)
            self.mask[g, 0, pad, pad] = True

    def hidden_index(self, sample: int, positions: torch.Tensor) -> torch.Tensor:
        """Indices into the flattened ``[U * N]`` hidden states of sample ``sample``'s tokens at
        ``positions`` (a long tensor)."""
        g, P, at = self._where[sample]
        inside = torch.where(positions < P, positions, at + positions - P)
        return g * self.width + inside

    def attention_mask(self, attn_implementation: str | None, dtype: torch.dtype) -> torch.Tensor:
        """:attr:`mask` as the attention takes it: booleans for ``sdpa`` (and unknown), an
        additive mask of ``dtype`` (0 where attended, its lowest value elsewhere) for ``eager``."""
        if attn_implementation == "eager":
            return torch.zeros(self.mask.shape, dtype=dtype).masked_fill_(~self.mask, torch.finfo(dtype).min)
        return self.mask
