"""An LLM judge: a generator scores a finished episode from a prompt template and a parsed score.

The pieces are pure (:func:`judge_fields`, :func:`render_judge_prompt`, :func:`parse_score`);
:class:`LLMJudge` puts them around one call of a generator's ``generate(prompt_ids, sampling)``
(the :data:`~agentrl.engine.common.interfaces.GenerateFn` seam), bounded by a timeout.

What the judge sees (the template's placeholders):

- ``{response}``: the model's last turn, decoded without special tokens (its final answer);
- ``{transcript}``: everything after the prompt, in order: every model turn and every tool
  output the environment showed it, decoded without special tokens;
- ``{<field>}``: any field of the dataset row (``{question}``, ``{answer}``...), as text.

Other ``{...}`` in the template (``\\boxed{}``, JSON examples) are left as written.

A judge that does not answer in time, fails, or answers without a score in
``[score_min, score_max]`` raises :class:`~agentrl.errors.RewardModelError`: the episode is then an
infrastructure failure kept out of the loss, never a reward of 0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import anyio

from agentrl.engine.common.interfaces import GenerateFn
from agentrl.engine.common.trajectory import Trajectory
from agentrl.errors import RewardModelError
from agentrl.judge_prompt import DEFAULT_SCORE_PATTERN, DEFAULT_TEMPLATE

__all__ = [
    "JudgeSettings",
    "LLMJudge",
    "judge_fields",
    "parse_score",
    "render_judge_prompt",
]

@dataclass(frozen=True)
class JudgeSettings:
    """How a judge is asked and how its answer is read."""

    template: str = DEFAULT_TEMPLATE
    """The judge's prompt, with placeholders (see the module docstring)."""
    score_pattern: str = DEFAULT_SCORE_PATTERN
    """Regex finding the score in the judge's answer: its first group (or the whole match when it
    has none) is the number; the *last* match counts (a judge may reason before it scores)."""
    score_min: float = 0.0
    """The lowest score the template asks for: mapped to 0."""
    score_max: float = 10.0
    """The highest score the template asks for: mapped to 1."""
    max_tokens: int = 64
    """Most tokens the judge may write."""
    temperature: float = 0.0
    """Sampling temperature of the judge (0: greedy, the same answer for the same episode)."""
    timeout_s: float = 60.0
    """Longest wait for one judge answer, seconds."""
    output_regex: str | None = None
    """Constrain the judge's whole answer to this regex with vLLM structured outputs (vLLM
    generators only); None: unconstrained, the score is searched for with ``score_pattern``."""

    def sampling(self) -> dict[str, Any]:
        """``SamplingParams`` arguments of a judge call."""
        params: dict[str, Any] = {"max_tokens": self.max_tokens, "temperature": self.temperature}
        if self.output_regex is not None:
            params["structured_outputs"] = {"regex": self.output_regex}
        return params


def judge_fields(tokenizer: Any, trajectory: Trajectory, row: dict[str, Any]) -> dict[str, str]:
    """The values of a template's placeholders for one episode: the row's fields as text, then
    ``response`` (the model's last turn) and ``transcript`` (all after the prompt), decoded
    without special tokens."""
    mask = trajectory.loss_mask
    first = next((i for i, m in enumerate(mask) if m), len(mask))
    end = max((i + 1 for i, m in enumerate(mask) if m), default=len(mask))
    start = end
    while start > first and mask[start - 1]:
        start -= 1
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True).strip()
    fields = {str(k): str(v) for k, v in row.items()}
    fields["response"] = decode(trajectory.tokens[start:end]) if first < len(mask) else ""
    fields["transcript"] = decode(trajectory.tokens[first:]) if first < len(mask) else ""
    return fields


_PLACEHOLDER = re.compile(r"\{(\w+)\}")


def render_judge_prompt(template: str, fields: dict[str, str]) -> str:
    """``template`` with each ``{name}`` that ``fields`` holds replaced by its value; any other
    braces are left as written."""
    return _PLACEHOLDER.sub(lambda m: fields.get(m.group(1), m.group(0)), template)


def parse_score(text: str, settings: JudgeSettings) -> float:
    """The judge's score in ``text`` mapped from ``[score_min, score_max]`` to ``[0, 1]``.

    Raises :class:`RewardModelError` (saying why, with the start of the answer) when the pattern
    finds no number, or the number lies outside the range."""
    matches = list(re.finditer(settings.score_pattern, text))
    shown = " ".join(text.split())[:160]
    if not matches:
        raise RewardModelError(f"judge: no score in its answer (pattern {settings.score_pattern!r}): {shown!r}")
    m = matches[-1]
    raw = m.group(1) if m.re.groups else m.group(0)
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise RewardModelError(f"judge: the score {raw!r} is not a number (answer: {shown!r})") from None
    lo, hi = settings.score_min, settings.score_max
    if not lo <= value <= hi:
        raise RewardModelError(f"judge: the score {value:g} is outside [{lo:g}, {hi:g}] (answer: {shown!r})")
    return (value - lo) / (hi - lo)


class LLMJudge:
    """Scores episodes with a generator: renders the template as one user message with the judge
    model's chat template (``tokenizer``), generates with ``generate`` (prompt ids, sampling ->
    :class:`~agentrl.engine.common.interfaces.Generation`) and parses the score. ``generate`` is
    bounded by ``settings.timeout_s`` here, whatever bounds it has of its own."""

    def __init__(self, settings: JudgeSettings, tokenizer: Any, generate: GenerateFn) -> None:
        self.settings = settings
        self.tokenizer = tokenizer
        self.generate = generate

    def prompt_ids(self, fields: dict[str, str]) -> list[int]:
        """The judge's prompt for ``fields``, as token ids of the judge model."""
        text = render_judge_prompt(self.settings.template, fields)
        chat = self.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
        return list(self.tokenizer.encode(chat, add_special_tokens=False))

    async def answer(self, fields: dict[str, str]) -> str:
        """The judge's answer (decoded without special tokens) for ``fields``."""
        s = self.settings
        try:
            with anyio.fail_after(s.timeout_s):
                gen = await self.generate(self.prompt_ids(fields), s.sampling())
        except TimeoutError:
            raise RewardModelError(f"judge: no answer within {s.timeout_s:g} s") from None
        except Exception as exc:
            raise RewardModelError(f"judge: the generator failed: {type(exc).__name__}: {exc}") from exc
        return self.tokenizer.decode(gen.token_ids, skip_special_tokens=True)

    async def score(self, fields: dict[str, str]) -> tuple[float, str]:
        """``(score in [0, 1], the judge's answer)`` for ``fields``; raises
        :class:`RewardModelError` on a timeout, a failure or an answer without a usable score."""
        text = await self.answer(fields)
        return parse_score(text, self.settings), text
