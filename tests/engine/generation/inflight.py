"""Waiting for a request to be in flight in an in-process vLLM engine: a test that makes a request
span a weight update starts the update once the request samples, not after a guessed sleep."""

from __future__ import annotations

import asyncio


def sampled_tokens(gen) -> list[int]:
    """Tokens sampled so far by each request the vLLM engine of ``gen`` (a started
    ``VllmGenerator``) holds: its output processor's state per request (the generator asks for
    final outputs only, so nothing else shows it)."""
    return [state.detokenizer.num_output_tokens() for state in gen.engine.output_processor.request_states.values()]


async def sampling_started(gen, timeout_s: float = 120.0) -> None:
    """Wait until the engine holds exactly one request and that request has sampled a token."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not ((p := sampled_tokens(gen)) and len(p) == 1 and p[0] > 0):
        assert asyncio.get_running_loop().time() < deadline, f"no request sampling after {timeout_s} s: {p}"
        await asyncio.sleep(0.002)
