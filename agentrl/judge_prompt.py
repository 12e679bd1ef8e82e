"""The LLM judge's prompt defaults: plain values the recipe schema (:mod:`agentrl.config`) and
the judge (:mod:`agentrl.engine.rewards.judge`) both read, kept outside the engine so that the
recipe layer imports nothing of it."""

from __future__ import annotations

__all__ = ["DEFAULT_SCORE_PATTERN", "DEFAULT_TEMPLATE", "EPISODE_PLACEHOLDERS"]

EPISODE_PLACEHOLDERS = ("response", "transcript")
"""Placeholders filled from the episode itself; a template must use at least one."""

DEFAULT_TEMPLATE = (
    "Rate the answer to the question from 0 (wrong or unhelpful) to 10 (correct and clear).\n"
    "Question: {question}\nAnswer: {response}\nReply with 'Score: N'."
)
"""The default judge prompt (one user message, rendered with the judge model's chat template)."""

DEFAULT_SCORE_PATTERN = r"[Ss]core\s*[:=]\s*(-?\d+(?:\.\d+)?)"
"""The default score regex: ``Score: 7``; the first group is the number."""
