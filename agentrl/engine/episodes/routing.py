"""Routing a rollout worker's groups to the generators: least outstanding tokens, with group
affinity, and every generator call bounded in time.

A group goes to the generator with the fewest outstanding tokens from this worker when it starts,
and all its samples and turns stay there (they share the prompt, so prefix caching pays off).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio

from agentrl.engine.common.interfaces import GenerateFn, Generation
from agentrl.errors import AgentRLError, GeneratorError

__all__ = ["GeneratorRouter"]


class GeneratorRouter:
    """One worker's view of the generators.

    ``generators``: objects with an async ``generate(prompt_ids, sampling)`` method or Ray actor
    handles of :class:`~agentrl.engine.common.interfaces.Generator` (a vLLM or HTTP generator);
    ``generate_timeout_s``: the longest wait for one call, after which it is a
    :class:`~agentrl.errors.GeneratorError`."""

    def __init__(self, generators: list[Any], *, generate_timeout_s: float) -> None:
        self.generators = list(generators)
        self.outstanding = [0] * len(self.generators)
        """Tokens (prompt + max new) of this worker's requests in flight, per generator."""
        self.generate_timeout_s = generate_timeout_s

    def set_generators(self, generators: list[Any]) -> None:
        """Replace the generator handles (after a restart); groups in flight keep theirs. The
        outstanding counts of the generators that remain are kept (their requests still run); a
        new generator starts at 0, and a count whose generator is gone is dropped."""
        n = len(generators)
        self.outstanding = self.outstanding[:n] + [0] * max(0, n - len(self.outstanding))
        self.generators = list(generators)

    def _release(self, index: int, tokens: int) -> None:
        """Stop counting ``tokens`` on generator ``index`` (nothing when it is no longer in the set)."""
        if index < len(self.outstanding):
            self.outstanding[index] = max(0, self.outstanding[index] - tokens)

    def pick(self) -> int:
        """Index of the generator with the fewest outstanding tokens from this worker (ties: the
        lowest index). A whole group is pinned to the generator picked when it starts."""
        return min(range(len(self.generators)), key=lambda i: (self.outstanding[i], i))

    @contextmanager
    def reserved(self, index: int, tokens: int) -> Iterator[None]:
        """Count ``tokens`` as outstanding on generator ``index`` while the block runs (a group's
        expected load, reserved at once so that groups starting together spread out)."""
        self.outstanding[index] += tokens
        try:
            yield
        finally:
            self._release(index, tokens)

    def generate_fn(self, index: int) -> GenerateFn:
        """A bounded ``generate`` on generator ``index``: its load counted while it runs; a call
        that times out or fails (a dead Ray actor, a lost connection) is a GeneratorError naming it."""
        gen = self.generators[index]
        remote = hasattr(gen.generate, "remote")

        async def generate(ids: list[int], params: dict[str, Any]) -> Generation:
            load = len(ids) + int(params.get("max_tokens", 0))
            self.outstanding[index] += load
            try:
                with anyio.fail_after(self.generate_timeout_s):
                    if remote:
                        return await gen.generate.remote(ids, params)
                    return await gen.generate(ids, params)
            except TimeoutError:
                raise GeneratorError(f"generator {index} did not answer within {self.generate_timeout_s} s") from None
            except AgentRLError:
                raise
            except Exception as exc:  # a dead Ray actor, a lost connection
                raise GeneratorError(f"generator {index} call failed: {type(exc).__name__}: {exc}") from exc
            finally:
                self._release(index, load)

        return generate
