"""The contracts between the engine's parts, declared as Protocols.

:class:`Generator` is what the rollout workers and the fleet call on a generator: the vLLM
engine (:class:`~agentrl.engine.generation.generator.VllmGenerator`), a client of a vLLM server
(:class:`~agentrl.engine.generation.http_generator.HttpGenerator`) and the in-process double
(:class:`~agentrl.engine.testing.FakeGenerator`) all implement it (checked by a test).
:data:`GenerateFn` is the narrower seam the episodes, the agent gateway and the judge play on:
one ``generate`` call, whoever routes and bounds it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

__all__ = ["GenerateFn", "Generation", "Generator"]


@dataclass
class Generation:
    """The result of one generation call.

    ``token_ids``, ``logprobs`` and ``versions`` have one entry per generated token.
    """

    token_ids: list[int]
    """Generated token ids (stop strings included, nothing re-tokenised)."""
    logprobs: list[float]
    """Log-probability of each generated token under the weights that sampled it."""
    versions: list[int]
    """Weight version that sampled each token."""
    finish_reason: str
    """``stop`` (EOS or a stop string), ``length`` (max_tokens) or ``abort``."""
    stop_reason: int | str | None = None
    """The stop string or token id that ended generation, if any."""


GenerateFn = Callable[[list[int], dict[str, Any]], Awaitable[Generation]]
"""``generate(prompt_ids, sampling) -> Generation``: one call of a generator (``sampling``: vLLM
``SamplingParams`` arguments), as an episode, the agent gateway or the judge makes it; the rollout
worker's :class:`~agentrl.engine.episodes.routing.GeneratorRouter` gives bounded ones."""


@runtime_checkable
class Generator(Protocol):
    """A token-in/token-out generator of one weight version at a time."""

    async def start(self) -> dict[str, Any]:
        """Start serving (load the model); a description of what runs (for the log)."""

    async def generate(self, prompt_token_ids: list[int], sampling: dict[str, Any]) -> Generation:
        """Continue ``prompt_token_ids``; ``sampling`` holds ``max_tokens``, ``temperature``,
        ``top_p``, ``stop``, ``seed``... (vLLM ``SamplingParams`` fields). Every returned token
        carries its log-probability and the weight version that sampled it."""

    async def update_weights(self, version: int, path: str) -> float:
        """Serve the Hugging Face folder ``path`` as weight version ``version`` from now on,
        without dropping requests in flight; the generation stall, seconds."""

    async def stats(self) -> dict[str, Any]:
        """Counters: ``version``, ``tokens_generated``, ``update_stalls_s``, ``busy_s`` (seconds
        with a request in flight) and ``alive_s`` (seconds since start-up)."""

    async def shutdown(self) -> None:
        """Stop serving and free the engine's resources."""

    async def sleep(self, level: int) -> float:
        """Colocated placement: free the device for the learner until the next
        ``update_weights`` or ``generate`` wakes the generator (level 1: weights kept in host
        memory, KV cache dropped; level 2: weights dropped too, a new version is about to
        replace them). Seconds it took. Default: nothing to free (0.0)."""
        return 0.0
