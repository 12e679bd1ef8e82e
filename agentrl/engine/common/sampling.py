"""The run's sampling: one typed value, read from the recipe once (``engine/wiring.py``) and given
to both sides that must agree on it: the rollout workers, whose generators sample with it, and
the learner, whose log-probs are those of the same tempered distribution."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentrl.errors import ConfigError

__all__ = ["Sampling"]


@dataclass(frozen=True)
class Sampling:
    """How the policy's tokens are sampled in training episodes.

    Attributes:
        temperature: the sampling temperature (> 0); the learner divides its logits by it.
        top_p: the nucleus threshold (0 < top_p <= 1; 1: the whole distribution).
        stop: stop strings that end a turn (kept in the output).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ConfigError(f"sampling: temperature must be positive (the learner divides its logits by it), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"sampling: top_p must be in (0, 1], got {self.top_p}")
        if isinstance(self.stop, str) or not all(isinstance(s, str) for s in self.stop):
            raise ConfigError(f"sampling: stop must be a sequence of strings, got {self.stop!r}")
        object.__setattr__(self, "stop", tuple(self.stop))

    def params(self) -> dict[str, Any]:
        """The vLLM ``SamplingParams`` arguments every turn shares: ``temperature``, ``top_p``
        and ``stop`` (a list); a turn adds its own ``max_tokens`` and ``seed``."""
        return {"temperature": self.temperature, "top_p": self.top_p, "stop": list(self.stop)}
