"""A rollout worker's scoring bundle: everything it needs to add the model-based rewards to its
groups, and nothing else of the worker.

The settings come from the recipe as :class:`ScoringSettings`
(:func:`agentrl.engine.wiring.scoring_settings`); the handles of the reward actors (a separate
judge's generators, the reward model) come from the controller and are replaced in-run
(:mod:`agentrl.engine.rewards.reward_actors`). :meth:`ScoringBundle.scorer` gives each group its
:class:`~agentrl.engine.rewards.scoring.EpisodeScorer`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentrl.engine.common.interfaces import GenerateFn
from agentrl.engine.rewards.functions import RewardFunction
from agentrl.engine.rewards.judge import JudgeSettings, LLMJudge
from agentrl.engine.rewards.scoring import EpisodeScorer, RewardSettings

__all__ = ["ScoringBundle", "ScoringSettings"]


@dataclass(frozen=True)
class ScoringSettings:
    """A rollout worker's model-based rewards, as plain values (picklable: they travel to the
    worker's Ray actor, which builds its bundle with :meth:`ScoringBundle.from_settings`). The
    defaults score with the environment's reward alone."""

    reward: RewardSettings | None = None
    """The weights of the reward's parts and the reward functions (None: the environment's reward alone)."""
    judge: JudgeSettings | None = None
    """The LLM judge's settings (None: no judge)."""
    judge_tokenizer: str | None = None
    """A separate judge model's tokenizer, a folder or hub id, for the judge's prompts (None: the policy's)."""


class ScoringBundle:
    """How one rollout worker scores its groups.

    ``reward``: the weights of the reward's parts and the reward functions (None: the
    environment's reward alone, :meth:`scorer` gives None); ``judge``: the LLM judge's settings
    (None: no judge); ``tokenizer``: the policy's (decodes episodes; tokenises the judge's prompts
    when ``judge_tokenizer`` is None); ``judge_generators``: a separate judge model's generators,
    asked in turn (empty: the judge asks the generator the group ran on); ``reward_model``: the
    reward model's handle (None: none).

    The reward functions are loaded here, once: a :class:`~agentrl.errors.ConfigError` names one
    that does not load when the worker starts, not at its first episode."""

    def __init__(
        self, *, reward: RewardSettings | None, judge: JudgeSettings | None, tokenizer: Any, judge_tokenizer: Any = None,
        judge_generators: list[Any] | None = None, reward_model: Any = None,
    ) -> None:
        self.reward = reward
        self.judge = judge
        self.tokenizer = tokenizer
        self.judge_tokenizer = judge_tokenizer if judge_tokenizer is not None else tokenizer
        self.judge_generators = list(judge_generators or [])
        self._judge_next = 0
        self.reward_model = reward_model
        self.functions: list[RewardFunction] = [RewardFunction(f) for f in reward.functions] if reward is not None else []
        """The loaded reward functions of ``reward.functions``."""

    @classmethod
    def from_settings(
        cls, settings: ScoringSettings, *, tokenizer: Any, judge_generators: list[Any] | None = None, reward_model: Any = None,
    ) -> ScoringBundle:
        """The bundle of ``settings`` with the policy's ``tokenizer`` and the reward actors'
        handles (see the class); a separate judge's tokenizer is loaded here when there is a judge."""
        s = settings
        judge_tokenizer = None
        if s.judge is not None and s.judge_tokenizer:
            from agentrl.models.loading import load_tokenizer

            judge_tokenizer = load_tokenizer(s.judge_tokenizer)
        return cls(
            reward=s.reward, judge=s.judge, tokenizer=tokenizer, judge_tokenizer=judge_tokenizer,
            judge_generators=judge_generators, reward_model=reward_model,
        )

    def set_judge_generators(self, generators: list[Any]) -> None:
        """Replace a separate judge's generator handles (after one was replaced); groups being
        scored keep the judge they were given."""
        self.judge_generators = list(generators)

    def set_reward_model(self, reward_model: Any) -> None:
        """Replace the reward model's handle (after it was replaced); scores in flight keep theirs."""
        self.reward_model = reward_model

    def scorer(self, generate: GenerateFn) -> EpisodeScorer | None:
        """The scorer of a group whose episodes ran on ``generate`` (the judge asks it when the
        judge is the policy); None when the recipe has only the environment's reward."""
        if self.reward is None:
            return None
        judge = None
        if self.judge is not None:
            if self.judge_generators:  # a frozen judge group: round robin
                gen = self.judge_generators[self._judge_next % len(self.judge_generators)]
                self._judge_next += 1
                generate = gen.generate.remote if hasattr(gen.generate, "remote") else gen.generate
            judge = LLMJudge(self.judge, self.judge_tokenizer, generate)
        scorer = EpisodeScorer(
            self.reward, tokenizer=self.tokenizer, judge=judge, reward_model=self.reward_model, functions=self.functions
        )
        return scorer if scorer.active else None
