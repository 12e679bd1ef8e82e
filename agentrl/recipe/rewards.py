"""Model-based rewards: the LLM judge, the reward model and the user's reward functions.

Sections of the recipe (:class:`agentrl.config.Recipe`); import them from :mod:`agentrl.config`."""

from __future__ import annotations

import re

from typing import Any, Literal

from pydantic import Field, model_validator

from agentrl import judge_prompt
from agentrl.recipe.section import Section

__all__ = ["JudgeConfig", "RewardModelConfig", "RewardFunctionConfig", "RewardConfig"]


class JudgeConfig(Section):
    """An LLM judge that scores each finished training episode (``agentrl/engine/rewards/judge.py``): the
    template is sent as one user message, the score is read from the answer with
    ``score_pattern`` and mapped from ``[score_min, score_max]`` to ``[0, 1]``. A judge that times
    out or answers without a score in range makes the episode an infrastructure failure, kept out
    of the loss (never a reward of 0)."""

    model: str = "policy"
    """``policy``: the policy's own generators judge (the current weights); else a folder or hub id
    served by a second group of generators that never receive weight updates."""
    weight: float = Field(1.0, allow_inf_nan=False)
    """Weight of the judge's score (in [0, 1]) in the episode's reward."""
    template: str = judge_prompt.DEFAULT_TEMPLATE
    """The judge's prompt. Placeholders: ``{response}`` (the model's last turn), ``{transcript}``
    (everything after the prompt: model turns and tool outputs), ``{<field>}`` (any field of the
    dataset row, e.g. ``{question}``, ``{answer}``); other braces are left as written."""
    score_pattern: str = judge_prompt.DEFAULT_SCORE_PATTERN
    """Regex of the score in the answer: its first group (or the whole match) is the number; the
    last match counts."""
    score_min: float = Field(0.0, allow_inf_nan=False)
    """The lowest score the template asks for (mapped to 0)."""
    score_max: float = Field(10.0, allow_inf_nan=False)
    """The highest score the template asks for (mapped to 1)."""
    output_regex: str | None = None
    """Constrain the judge's whole answer to this regex with vLLM structured outputs, e.g.
    ``"Score: [0-9]"`` (vLLM generators only); None: free text, searched with ``score_pattern``."""
    max_tokens: int = Field(64, gt=0)
    """Most tokens of the judge's answer."""
    temperature: float = Field(0.0, ge=0)
    """Sampling temperature of the judge (0: greedy)."""
    timeout_s: float = Field(60.0, gt=0)
    """Longest wait for one judge answer, seconds."""
    num_generators: int = Field(1, gt=0)
    """Generators of a separate judge model (unused with ``model = "policy"``)."""
    num_cpus: float = Field(1.0, gt=0)
    """Ray CPUs per judge generator (separate model only)."""
    num_gpus: float = Field(0.0, ge=0)
    """Ray GPUs per judge generator (separate model only): more than 1 (a whole number) makes its
    engine tensor parallel over them; a share below 1 scales its GPU memory use; 0 is refused
    beside GPU generators (vLLM's CUDA build cannot serve it on the CPU)."""
    max_restarts: int = Field(2, ge=0)
    """Times a run replaces a separate judge's generator whose process died (killed, out of
    memory, crashed) with a new one of the same settings; the episodes it was scoring are
    infrastructure failures (never a 0), their groups re-issued when nothing of them is left. 0: a
    dead judge generator ends the run."""

    @model_validator(mode="after")
    def _check_judge(self) -> "JudgeConfig":
        import re

        if not any("{" + name + "}" in self.template for name in judge_prompt.EPISODE_PLACEHOLDERS):
            raise ValueError("template must contain {response} or {transcript} (what the judge is to score)")
        if self.score_max <= self.score_min:
            raise ValueError(f"score_max ({self.score_max:g}) must be greater than score_min ({self.score_min:g})")
        for name in ("score_pattern", "output_regex"):
            pattern = getattr(self, name)
            if pattern is not None:
                try:
                    re.compile(pattern)
                except re.error as exc:
                    raise ValueError(f"{name} {pattern!r} is not a valid regex: {exc}") from None
        return self


class RewardModelConfig(Section):
    """A sequence-classification reward model (``AutoModelForSequenceClassification``, one label)
    served by one Ray actor that batches the rollout workers' requests
    (``agentrl/engine/rewards/reward_model.py``). It scores the conversation ``[user: the row's
    prompt_field, assistant: the model's last turn]``; a failure or a timeout makes the episode
    an infrastructure failure, kept out of the loss."""

    path: str
    """Folder or hub id of the reward model."""
    weight: float = Field(1.0, allow_inf_nan=False)
    """Weight of the reward model's score (its raw output) in the episode's reward."""
    prompt_field: str = "question"
    """The dataset row's field shown as the user's message."""
    max_batch_size: int = Field(16, gt=0)
    """Most episodes scored in one forward pass."""
    max_wait_ms: float = Field(5.0, ge=0)
    """How long a request waits for others to share its forward pass, milliseconds."""
    max_length: int = Field(2048, gt=0)
    """Conversations are cut to this many tokens (keeping their end)."""
    timeout_s: float = Field(60.0, gt=0)
    """Longest wait for one episode's score, seconds."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Parameter dtype (float32 on CPU)."""
    num_cpus: float = Field(1.0, gt=0)
    """Ray CPUs of the reward model's actor."""
    num_gpus: float = Field(0.0, ge=0)
    """Ray GPUs of the reward model's actor (it runs on the GPU when it has one)."""
    torch_threads: int = Field(1, gt=0)
    """torch threads of the actor on CPU."""
    max_restarts: int = Field(2, ge=0)
    """Times a run replaces the reward model's actor when its process died (killed, out of memory,
    crashed) with a new one of the same settings; the episodes it was scoring are infrastructure
    failures (never a 0), their groups re-issued when nothing of them is left. 0: a dead reward
    model ends the run."""


class RewardFunctionConfig(Section):
    """One of the user's reward functions (``agentrl/engine/rewards/functions.py``): a Python
    function of the finished episode taking any of ``completion`` (the model's last turn),
    ``messages`` (the conversation), ``row`` (the dataset row) and ``env_reward``, returning a
    float; it may be ``async def``. One that raises, returns no finite number or times out makes
    the episode an infrastructure failure, kept out of the loss. A plain string in
    ``reward.functions`` is the ``fn`` of an entry with weight 1."""

    fn: str
    """``module:function``; the module is found beside the recipe or in the current directory
    (and is shipped to every Ray worker)."""
    weight: float = Field(1.0, allow_inf_nan=False)
    """Weight of the function's value in the episode's reward."""
    timeout_s: float = Field(60.0, gt=0)
    """Longest wait for the function's value for one episode, seconds."""

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, value: Any) -> Any:
        return {"fn": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _check_fn(self) -> "RewardFunctionConfig":
        if self.fn.count(":") != 1 or not all(part.strip() for part in self.fn.split(":")):
            raise ValueError(f"fn {self.fn!r}: expected 'module:function'")
        return self


class RewardConfig(Section):
    """How an episode's reward is made: ``env_weight * env_reward + judge.weight * judge_score +
    model.weight * rm_score + the sum of functions[i].weight * functions[i]``
    (``agentrl/engine/rewards/scoring.py``). Without a judge, a reward model and reward functions,
    the environment's rule-based reward alone (times ``env_weight``). Evaluation always reports
    the environment's reward alone."""

    env_weight: float = Field(1.0, allow_inf_nan=False)
    """Weight of the environment's rule-based reward."""
    judge: JudgeConfig | None = None
    """An LLM judge (absent: none)."""
    model: RewardModelConfig | None = None
    """A reward model (absent: none)."""
    functions: list[RewardFunctionConfig] = []
    """The user's reward functions (TRL's ``reward_funcs``): ``[[reward.functions]]`` tables
    (``fn``, ``weight``, ``timeout_s``), or ``["module:function", ...]`` each with weight 1."""
