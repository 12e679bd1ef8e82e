"""Collective weight sync for real: a vLLM engine (CPU) joins a gloo group through vLLM's
weight-transfer engine API and receives a weight version broadcast by a trainer-side engine.

The generator runs in this process; the trainer side runs in a thread and drives the generator
through ``LocalGeneratorClient`` (in a run, ``GeneratorClient`` does the same over Ray handles:
tests/e2e/test_train_e2e.py).
"""

from __future__ import annotations

import asyncio
import re
import time

import pytest
import torch

from tests.engine.generation.inflight import sampling_started

pytestmark = pytest.mark.vllm


def _perturbed(model_dir, seed: int):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return hf


def _hf_logprobs(hf, prompt: list[int], ids: list[int]) -> list[float]:
    with torch.no_grad():
        lp = torch.log_softmax(hf(torch.tensor([prompt + ids])).logits[0].float(), -1)
    return [lp[len(prompt) - 1 + i, t].item() for i, t in enumerate(ids)]


def _connect(client, world_size: int, source, timeout_s: float):
    from agentrl.engine.generation.weight_transfer import free_endpoint, trainer_connect

    address, port = free_endpoint()
    return trainer_connect("gloo", rank=0, address=address, port=port, world_size=world_size, client=client, source=source, timeout_s=timeout_s)


PROMPT = list(range(5, 25))
GROUP_TIMEOUT_S = 3.0
"""The transfer group's timeout in the failure cases (rendezvous, broadcast)."""
SLACK_S = 6.0
"""Seconds a failure may come after that timeout on a loaded 2-core machine (torch's rendezvous
rounds its wait up to whole seconds; a worker error then ends the vLLM engine)."""
GENERATOR_TIMEOUT_S = 20.0
"""The generator's own bound on a call: well above the group's timeout plus its slack, so a
failure by the group's timeout is told apart from one by the generator's; the last request, to
the engine the failed broadcast left paused, waits this long before it fails (60 s made it the
test's longest wait)."""


def test_broadcast_loads_the_version_into_vllm(tiny_calc_model) -> None:
    from agentrl.engine.generation.generator import EngineSettings, VllmGenerator
    from agentrl.engine.generation.weight_transfer import LocalGeneratorClient, model_source
    from agentrl.errors import GeneratorError

    async def main() -> None:
        # the worker in the engine core (cpu_engine_processes = 1): the collective reaches it there as in a
        # worker process of its own (the default, with gloo: tests/e2e/test_train_e2e.py), and it starts sooner
        g = VllmGenerator(EngineSettings(model=str(tiny_calc_model), max_model_len=512, kv_cache_gib=0.1, weight_transfer="gloo",
                                         cpu_engine_processes=1), timeout_s=GENERATOR_TIMEOUT_S)
        await g.start()
        try:
            client = LocalGeneratorClient(g, asyncio.get_running_loop(), 120.0)
            hf = _perturbed(tiny_calc_model, 0)
            before = await g.generate(PROMPT, {"max_tokens": 8, "temperature": 0.0, "ignore_eos": True})
            assert max(abs(a - b) for a, b in zip(_hf_logprobs(hf, PROMPT, before.token_ids), before.logprobs)) > 1e-2

            engine = await asyncio.to_thread(_connect, client, 2, model_source(hf, torch.float32), 30.0)
            client.version = 3

            # a request in flight during the update survives it (pause mode "keep"): its first
            # tokens come from version 0, its last from version 3
            long = asyncio.ensure_future(g.generate(PROMPT, {"max_tokens": 450, "temperature": 1.0, "ignore_eos": True, "seed": 1}))
            await sampling_started(g)  # in flight: the update starts once it samples, not after a guessed sleep
            await asyncio.to_thread(engine.send_weights)
            spanning = await long
            assert len(spanning.token_ids) == 450 and spanning.versions[0] == 0 and spanning.versions[-1] == 3
            assert spanning.versions == sorted(spanning.versions)
            assert g.version == 3 and len(g.update_stalls_s) == 1

            after = await g.generate(PROMPT, {"max_tokens": 8, "temperature": 0.0, "ignore_eos": True})
            assert after.versions == [3] * 8
            ref = _hf_logprobs(hf, PROMPT, after.token_ids)
            assert max(abs(a - b) for a, b in zip(ref, after.logprobs)) < 1e-4

            # a trainer whose group never fills (world 3, one generator) fails within its timeout
            # (torch's rendezvous error: trainer_connect does not translate it, Learner.
            # connect_weight_transfer makes it a WeightSyncError)
            t0 = time.monotonic()
            with pytest.raises(torch.distributed.DistStoreError, match=r"waiting for clients\. 2/3 clients joined") as failed:
                await asyncio.to_thread(_connect, client, 3, model_source(hf, torch.float32), GROUP_TIMEOUT_S)
            elapsed = time.monotonic() - t0
            print(f"rendezvous that never fills: {elapsed:.2f} s for a {GROUP_TIMEOUT_S} s timeout: {failed.value}")
            assert elapsed < GROUP_TIMEOUT_S + SLACK_S, elapsed
            again = await g.generate(PROMPT, {"max_tokens": 4, "temperature": 0.0, "ignore_eos": True})
            assert again.versions == [3] * 4  # the engine survived the failed rendezvous

            # a generator whose sender never broadcasts gives up within the group's timeout; a
            # worker error ends a vLLM engine, so it then reports itself dead (a run replaces it
            # and loads the version from disk). The sender stays in the group (a sender that is
            # gone closes its connections, which fails the receive at once, not by the timeout)
            silent = await asyncio.to_thread(_connect, client, 2, model_source(hf, torch.float32), GROUP_TIMEOUT_S)
            await g.begin_weight_update()
            meta = {"names": ["model.norm.weight"], "dtype_names": ["float32"], "shapes": [[hf.config.hidden_size]]}
            t0 = time.monotonic()
            with pytest.raises(GeneratorError) as failed:
                await g.receive_weights(meta)
            elapsed = time.monotonic() - t0
            print(f"broadcast that never comes: {elapsed:.2f} s for a {GROUP_TIMEOUT_S} s timeout: {failed.value}")
            # the group's timeout ended it: not earlier, and not the generator's own (GENERATOR_TIMEOUT_S: "ran past")
            assert str(failed.value).startswith("receiving weights failed: ") and re.search("timed out", str(failed.value), re.I), failed.value
            assert GROUP_TIMEOUT_S - 0.5 <= elapsed < GROUP_TIMEOUT_S + SLACK_S, elapsed
            assert silent.model_update_group is not None  # the sender was in the group all along
            with pytest.raises(GeneratorError):
                await g.generate(PROMPT, {"max_tokens": 4, "temperature": 0.0})
        finally:
            await g.shutdown()

    asyncio.run(main())
