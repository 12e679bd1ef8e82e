"""Send a module's weights straight into an in-process vLLM generator over a two-member gloo group,
as a learner rank does in a run (the trainer's side in a helper thread, the engine's in this
event loop). Shared by the tests that check the generator serves exactly the weights sent."""

from __future__ import annotations

import asyncio
from typing import Any

import torch

from agentrl.engine.generation.weight_transfer import LocalGeneratorClient, free_endpoint, model_source, trainer_connect


async def send_over_gloo(gen: Any, module: torch.nn.Module, version: int, wire_dtype: torch.dtype, timeout_s: float = 120.0) -> None:
    """Broadcast ``module``'s parameters in ``wire_dtype`` into ``gen`` (a started
    ``VllmGenerator`` with ``weight_transfer="gloo"``) as weight version ``version``."""
    client = LocalGeneratorClient(gen, asyncio.get_running_loop(), 180.0)

    def send() -> None:
        address, port = free_endpoint()
        engine = trainer_connect("gloo", rank=0, address=address, port=port, world_size=2, client=client,
                                 source=model_source(module, wire_dtype), timeout_s=timeout_s)
        client.version = version
        engine.send_weights()

    await asyncio.to_thread(send)
