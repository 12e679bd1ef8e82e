"""The one per-token record every consumer reads: a finished episode as the model saw it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: Episode statuses. Only ``ok``, ``truncated`` and ``overflow`` episodes are trained;
#: ``infra_failure`` episodes (sandbox down, verifier timeout, generator lost) never enter the loss.
TRAINABLE_STATUSES = frozenset({"ok", "truncated", "overflow"})
#: Status of an agent episode whose agent program raised, timed out or returned no usable reward:
#: kept out of the loss like ``infra_failure``, but counted apart (it is the user's code).
AGENT_FAILURE = "agent_failure"


@dataclass
class Trajectory:
    """One episode, token by token, exactly as the generator saw and wrote it.

    All per-token lists have the same length as ``tokens``.
    """

    tokens: list[int]
    """The whole sequence: prompt, every generated turn, every observation, in order."""
    loss_mask: list[int]
    """1 where the model wrote the token (trained), 0 for prompt, tool output and template glue."""
    behaviour_logprobs: list[float]
    """Log-probability of each token under the weights that sampled it (0.0 where mask is 0)."""
    versions: list[int]
    """Weight version that sampled each token; -1 where the model did not write it."""
    reward: float
    """Episode reward: the sum of the environment's step rewards, or with model-based rewards
    their weighted sum with a judge's and a reward model's scores (:mod:`agentrl.engine.rewards.scoring`)."""
    group_id: str
    """Samples of one prompt share a group id (group-relative advantages)."""
    sample_index: int
    """Index of this sample within its group."""
    prompt_index: int
    """Index of the dataset row this episode was about (resume bookkeeping)."""
    status: str = "ok"
    """``ok`` (ended by the env), ``truncated`` (turn limit), ``overflow`` (token budget hit),
    ``infra_failure`` (infrastructure broke; kept out of the loss), ``agent_failure`` (an agent
    program raised or never returned; kept out of the loss)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Per-episode numbers: turns, tool_calls, tool_errors, generated_tokens, latency_s..."""
    info: dict[str, Any] = field(default_factory=dict)
    """Free-form diagnostics (not used by the loss)."""
    segment_starts: tuple[int, ...] = ()
    """Token offsets where a new, independent sequence starts (besides 0). Empty for an episode
    that is one growing conversation (every environment episode). An agent episode whose calls do
    not extend one another (history rewritten, a sub-agent) holds one segment per conversation,
    concatenated: each is trained as its own sequence (no attention across segments), all with
    the episode's advantage."""

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if any(not 0 < s < n for s in self.segment_starts) or list(self.segment_starts) != sorted(set(self.segment_starts)):
            raise ValueError(f"segment_starts {list(self.segment_starts)} must increase strictly within (0, {n})")
        if not (len(self.loss_mask) == len(self.behaviour_logprobs) == len(self.versions) == n):
            raise ValueError(
                "trajectory per-token lists differ in length: "
                f"tokens={n} loss_mask={len(self.loss_mask)} "
                f"behaviour_logprobs={len(self.behaviour_logprobs)} versions={len(self.versions)}"
            )

    def segments(self) -> list[tuple[int, int]]:
        """``(start, end)`` token ranges of the independent sequences, in order."""
        bounds = [0, *self.segment_starts, len(self.tokens)]
        return list(zip(bounds[:-1], bounds[1:]))

    @property
    def trainable(self) -> bool:
        """Whether this episode may enter the loss (its status is not an infra failure)."""
        return self.status in TRAINABLE_STATUSES

    @property
    def sample_id(self) -> str:
        """``"<group_id>/<sample_index>"``: names this episode in logs and audit records."""
        return f"{self.group_id}/{self.sample_index}"

    @property
    def num_generated(self) -> int:
        """Tokens the model wrote."""
        return sum(self.loss_mask)

    @property
    def oldest_version(self) -> int | None:
        """Oldest weight version that wrote a token of this episode (None if it wrote none)."""
        vs = [v for v, m in zip(self.versions, self.loss_mask) if m]
        return min(vs) if vs else None

    @property
    def newest_version(self) -> int | None:
        """Newest weight version that wrote a token of this episode (None if it wrote none)."""
        vs = [v for v, m in zip(self.versions, self.loss_mask) if m]
        return max(vs) if vs else None


def episode_time_means(flat: list[Trajectory]) -> dict[str, float]:
    """Where an episode's time went, means over those of ``flat`` that measured it (seconds,
    each episode on its own clock; episodes run concurrently, so these do not add up to the
    step): ``episode_s_mean`` (start to end, scoring included), ``episode_generate_s_mean``
    (awaiting the generator, over all turns), ``episode_env_s_mean`` (awaiting the environment:
    its tools and sandbox). Empty when no episode measured them (agent episodes)."""
    timed = [t for t in flat if "generate_s" in t.metrics]
    if not timed:
        return {}
    n = len(timed)
    return {
        "episode_s_mean": sum(t.metrics.get("latency_s", 0.0) for t in timed) / n,
        "episode_generate_s_mean": sum(t.metrics["generate_s"] for t in timed) / n,
        "episode_env_s_mean": sum(t.metrics.get("env_s", 0.0) for t in timed) / n,
    }
