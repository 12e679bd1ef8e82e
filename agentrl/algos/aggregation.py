"""Loss aggregation: how per-token losses become one number (and how tokens are weighted)."""

from __future__ import annotations

from typing import Literal

import torch

AggregationMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"]
AGGREGATION_MODES: tuple[str, ...] = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")


def aggregate_loss(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token-mean",
    *,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
) -> torch.Tensor:
    """Aggregate ``per_token[B, T]`` over the tokens where ``mask`` is 1::

        token-mean            (1/N_tok) * sum_i sum_t m_it l_it
        seq-mean-token-sum    (1/N_seq) * sum_i sum_t m_it l_it
        seq-mean-token-mean   (1/N_seq) * sum_i (sum_t m_it l_it / sum_t m_it)

    ``token-mean`` weights every token equally (DAPO; long answers are not down-weighted);
    ``seq-mean-token-sum`` weights every token equally within a batch of fixed sequence count
    and has no length bias (Dr. GRPO, up to a constant); ``seq-mean-token-mean`` weights every
    sequence equally (original GRPO; GSPO's sequence-level objective).

    ``N_tok``/``N_seq`` default to this call's own counts (tokens; rows with at least one
    token). A learner that splits a batch into micro-batches passes the *batch's* counts, so
    that the sum of the micro-batches' results is the batch loss. A row's own token count in
    ``seq-mean-token-mean`` is always local: a sequence never spans micro-batches.
    """
    mask = mask.to(per_token.dtype)
    masked = per_token * mask
    if mode == "token-mean":
        n = float(mask.sum()) if num_tokens is None else float(num_tokens)
        return masked.sum() / max(n, 1.0)
    row_tokens = mask.sum(-1)
    n_seq = float((row_tokens > 0).sum()) if num_seqs is None else float(num_seqs)
    if mode == "seq-mean-token-sum":
        return masked.sum() / max(n_seq, 1.0)
    if mode == "seq-mean-token-mean":
        return (masked.sum(-1) / row_tokens.clamp_min(1.0)).sum() / max(n_seq, 1.0)
    raise ValueError(f"unknown loss aggregation {mode!r}; expected one of {AGGREGATION_MODES}")
