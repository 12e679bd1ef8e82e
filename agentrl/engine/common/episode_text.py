"""An episode as text for people: decoded spans, each labelled with the weight version that wrote it.

The samples files (``samples.jsonl``, ``eval_samples.jsonl``) keep, for the episodes they show,
``spans``: ``[[text, version], ...]`` in order, where consecutive tokens written by the same weight
version (or not written by the model: prompt, tool output, template glue, version ``-1``) are
decoded together. The report's trajectory browser colours them, so staleness and in-flight weight
updates (a version change inside one turn) are visible token by token.
"""

from __future__ import annotations

from typing import Any

__all__ = ["version_spans"]


def version_spans(tokenizer: Any, tokens: list[int], loss_mask: list[int], versions: list[int]) -> list[list[Any]]:
    """``[[text, version], ...]``: runs of tokens with the same writer, decoded (special tokens
    kept); ``version`` is -1 where the model did not write the token."""
    spans: list[list[Any]] = []
    start = 0
    for i in range(1, len(tokens) + 1):
        here = versions[start] if loss_mask[start] else -1
        if i == len(tokens) or (versions[i] if loss_mask[i] else -1) != here:
            spans.append([tokenizer.decode(tokens[start:i], skip_special_tokens=False), int(here)])
            start = i
    return spans
