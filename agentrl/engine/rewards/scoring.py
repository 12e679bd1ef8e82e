"""Model-based rewards beside the environment's: the reward of a finished episode as a weighted sum.

    reward = env_weight * env_reward + judge_weight * judge_score + rm_weight * rm_score
             + sum(weight_i * fn_i)

``env_reward`` is what the environment's rule-based rewards summed to; ``judge_score`` is an LLM
judge's score mapped to [0, 1] (:mod:`agentrl.engine.rewards.judge`); ``rm_score`` is a reward model's
raw output (:mod:`agentrl.engine.rewards.reward_model`); ``fn_i`` is the value of the user's reward
function i (:mod:`agentrl.engine.rewards.functions`). The parts are kept in the trajectory's metrics
(``env_reward``, ``judge_score``, ``rm_score``, ``fn/<function>``), the judge's answer in
``info["judge_answer"]``. All of an episode's scorers run at once.

Only trainable episodes are scored. A judge, reward model or reward function that fails, times
out or answers without a usable score makes the episode an ``infra_failure`` (kept out of the
loss, never a reward of 0): ``info["error"]`` says what happened in words and
``info["reward_failure"]`` names the scorers (``judge``, ``reward_model``, ``fn/<function>``); the
step log counts them (``reward_failures_batch``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import anyio

from agentrl.engine.common.episode_text import version_spans
from agentrl.engine.rewards.functions import RewardFunction, RewardFunctionSpec
from agentrl.engine.rewards.judge import LLMJudge, judge_fields
from agentrl.engine.common.trajectory import Trajectory
from agentrl.errors import RewardModelError

__all__ = ["JUDGE", "REWARD_MODEL", "EpisodeScorer", "RewardSettings", "reward_model_item"]

JUDGE = "judge"
"""The judge's name in ``info["reward_failure"]``."""
REWARD_MODEL = "reward_model"
"""The reward model's name in ``info["reward_failure"]``."""


@dataclass(frozen=True)
class RewardSettings:
    """The weights of the reward's parts (the recipe's ``[reward]`` values)."""

    env_weight: float = 1.0
    """Weight of the environment's rule-based reward."""
    judge_weight: float = 0.0
    """Weight of the judge's score (in [0, 1]); used only when there is a judge."""
    rm_weight: float = 0.0
    """Weight of the reward model's score; used only when there is a reward model."""
    rm_timeout_s: float = 60.0
    """Longest wait for the reward model's score of one episode, seconds."""
    rm_prompt_field: str = "question"
    """The dataset row's field shown to the reward model as the user's message."""
    functions: tuple[RewardFunctionSpec, ...] = ()
    """The user's reward functions, each with its weight (:mod:`agentrl.engine.rewards.functions`)."""


def reward_model_item(fields: dict[str, str], prompt_field: str) -> list[dict[str, str]]:
    """What the reward model scores for one episode: the conversation ``[user: the row's
    prompt field, assistant: the model's last turn]`` (:func:`~agentrl.engine.rewards.judge.judge_fields`)."""
    return [{"role": "user", "content": fields.get(prompt_field, "")}, {"role": "assistant", "content": fields["response"]}]


class EpisodeScorer:
    """Adds model-based rewards to finished episodes.

    ``judge``: an :class:`LLMJudge` (None: no judge); ``reward_model``: an object or Ray actor
    handle with ``score(items) -> list[float]`` (None: no reward model); ``functions``: the
    loaded reward functions of ``settings.functions`` (None: load them here; a ConfigError names
    one that does not load); ``tokenizer``: the policy's (decodes the episodes).

    An episode's ``info["messages"]`` (the conversation, left there by the rollout when a reward
    function asks for it) is consumed: :meth:`score` removes it."""

    def __init__(
        self, settings: RewardSettings, *, tokenizer: Any, judge: LLMJudge | None = None, reward_model: Any = None,
        functions: list[RewardFunction] | None = None,
    ) -> None:
        self.settings = settings
        self.tokenizer = tokenizer
        self.judge = judge
        self.reward_model = reward_model
        self.functions = list(functions) if functions is not None else [RewardFunction(f) for f in settings.functions]

    @property
    def active(self) -> bool:
        """Whether scoring changes anything (a judge, a reward model, a reward function, or
        ``env_weight != 1``)."""
        return self.judge is not None or self.reward_model is not None or bool(self.functions) or self.settings.env_weight != 1.0

    @property
    def wants_messages(self) -> bool:
        """Whether a reward function asks for the episode's ``messages`` (the rollout then keeps
        them in ``info["messages"]``)."""
        return any("messages" in f.wants for f in self.functions)

    async def _rm_score(self, fields: dict[str, str]) -> float:
        s = self.settings
        rm = self.reward_model
        item = reward_model_item(fields, s.rm_prompt_field)
        try:
            with anyio.fail_after(s.rm_timeout_s):
                scores = await (rm.score.remote([item]) if hasattr(rm.score, "remote") else rm.score([item]))
        except TimeoutError:
            raise RewardModelError(f"reward model: no score within {s.rm_timeout_s:g} s") from None
        except RewardModelError:
            raise
        except Exception as exc:
            raise RewardModelError(f"reward model: the call failed: {type(exc).__name__}: {exc}") from exc
        if len(scores) != 1 or scores[0] != scores[0] or abs(scores[0]) == float("inf"):
            raise RewardModelError(f"reward model: expected one finite score, got {scores!r}")
        return float(scores[0])

    async def score(self, t: Trajectory, row: dict[str, Any]) -> Trajectory:
        """Give ``t`` (in place, and returned) its combined reward, or mark it an
        ``infra_failure`` when a scorer failed. Episodes that are not trainable are left as
        they are."""
        messages = t.info.pop("messages", None)
        if not self.active or not t.trainable:
            return t
        s = self.settings
        fields = judge_fields(self.tokenizer, t, row)
        parts: dict[str, float] = {"env_reward": float(t.reward)}
        failures: dict[str, str] = {}
        answer: list[str] = []

        async def run_judge() -> None:
            try:
                parts["judge_score"], text = await self.judge.score(fields)  # type: ignore[union-attr]
                answer.append(text)
            except RewardModelError as exc:
                failures[JUDGE] = str(exc)

        async def run_rm() -> None:
            try:
                parts["rm_score"] = await self._rm_score(fields)
            except RewardModelError as exc:
                failures[REWARD_MODEL] = str(exc)

        episode = {"completion": fields["response"], "messages": list(messages or []), "row": dict(row), "env_reward": float(t.reward)}

        async def run_function(f: RewardFunction) -> None:
            try:
                parts[f.spec.metric] = await f(episode)
            except RewardModelError as exc:
                failures[f.spec.metric] = str(exc)

        async with anyio.create_task_group() as tg:
            if self.judge is not None:
                tg.start_soon(run_judge)
            if self.reward_model is not None:
                tg.start_soon(run_rm)
            for f in self.functions:
                tg.start_soon(run_function, f)
        if answer:
            t.info["judge_answer"] = answer[0]
        if failures:
            t.status = "infra_failure"
            t.info["reward_failure"] = ", ".join(failures)
            t.info["error"] = "; ".join(failures.values())
            t.info.setdefault("text", self.tokenizer.decode(t.tokens, skip_special_tokens=False))
            t.info.setdefault("spans", version_spans(self.tokenizer, t.tokens, t.loss_mask, t.versions))
            t.metrics.update(parts)
            return t
        t.reward = (
            s.env_weight * parts["env_reward"]
            + s.judge_weight * parts.get("judge_score", 0.0)
            + s.rm_weight * parts.get("rm_score", 0.0)
            + sum(f.spec.weight * parts[f.spec.metric] for f in self.functions)
        )
        t.metrics.update(parts)
        return t
