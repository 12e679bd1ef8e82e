"""Soft overlong punishment (DAPO, Yu et al., 2025): a length-dependent reward penalty."""

from __future__ import annotations

import torch


def overlong_penalty(lengths: torch.Tensor, max_tokens: int, buffer_tokens: int) -> torch.Tensor:
    """Penalty added to the reward of a response with ``|y|`` generated tokens::

        0                                     if |y| <= L_max - L_buf
        ((L_max - L_buf) - |y|) / L_buf       if L_max - L_buf < |y| <= L_max
        -1                                    if |y| > L_max

    with ``L_max = max_tokens`` and ``L_buf = buffer_tokens`` (``0 < L_buf <= L_max``). The
    ramp tells the model that long answers are getting risky before they are cut off.
    Example ``L_max = 10, L_buf = 4``: lengths ``(6, 8, 10, 12)`` get ``(0, -0.5, -1, -1)``.
    """
    if not 0 < buffer_tokens <= max_tokens:
        raise ValueError(f"overlong penalty needs 0 < buffer_tokens ({buffer_tokens}) <= max_tokens ({max_tokens})")
    lengths = lengths.to(torch.float64)
    start = max_tokens - buffer_tokens
    ramp = (start - lengths) / buffer_tokens
    return torch.where(lengths <= start, torch.zeros_like(lengths), torch.where(lengths <= max_tokens, ramp, -torch.ones_like(lengths)))
