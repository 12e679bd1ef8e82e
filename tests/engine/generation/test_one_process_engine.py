"""A CPU engine in one process (``generator.cpu_engine_processes = 1``) for real: vLLM's model
worker runs inside the engine-core process, with the OpenMP threads the binding gives it (here one
core of this process's: one thread, on that core; vLLM alone would compute on every core); it
samples the model's own log-probabilities and loads a version from disk in flight, as the default
two-process engine does (tests/engine/generation/test_weight_transfer.py, tests/e2e)."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from typing import Any

import psutil
import pytest
import torch

from tests.engine.generation.test_weight_transfer import PROMPT, _hf_logprobs, _perturbed

pytestmark = pytest.mark.vllm


@dataclass
class EngineProcess:
    name: str
    """Its title (``VLLM::EngineCore``, ``VLLM::Worker``...)."""
    process: psutil.Process

    def threads(self) -> list[Any]:
        return self.process.threads()


def _engine_processes(besides: frozenset[int] = frozenset()) -> list[EngineProcess]:
    """This process's vLLM engine processes, less those whose pids are in ``besides`` (engines that
    other tests of the session share and keep alive, started before this test's)."""
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            name = " ".join(p.cmdline()).strip()  # vLLM pads its process titles
        except psutil.NoSuchProcess:
            continue
        if name.startswith("VLLM::") and p.pid not in besides:
            found.append(EngineProcess(name, p))
    return found


def test_one_process_engine_samples_the_models_logprobs_and_loads_a_version_from_disk(tiny_calc_model, tmp_path) -> None:
    from transformers import AutoModelForCausalLM

    from agentrl.engine.generation.generator import EngineSettings, VllmGenerator

    core = max(os.sched_getaffinity(0))
    settings = EngineSettings(model=str(tiny_calc_model), max_model_len=512, kv_cache_gib=0.1, cpu_threads_bind=str(core),
                              cpu_engine_processes=1)
    perturbed = _perturbed(tiny_calc_model, 0)
    perturbed.save_pretrained(tmp_path / "v1")
    base = AutoModelForCausalLM.from_pretrained(tiny_calc_model, dtype=torch.float32)

    others = frozenset(e.process.pid for e in _engine_processes())  # the session's shared engine (tests/conftest.py tiny_llm), if a test before started it

    async def main() -> None:
        g = VllmGenerator(settings, timeout_s=120)
        info = await g.start()
        try:
            assert info["cpu_engine_processes"] == 1 and info["cpu_threads_bind"] == str(core), info
            (engine,) = _engine_processes(others)
            assert engine.name == "VLLM::EngineCore"  # no worker process of its own
            # its worker computes with one thread, bound to the one core
            assert info["torch_threads"] == 1, info
            assert {core} in [os.sched_getaffinity(t.id) for t in engine.threads()], "no thread of the engine is bound to the core"
            assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in os.environ  # set for the engine's start only

            first = await g.generate(PROMPT, {"max_tokens": 8, "temperature": 0.0, "ignore_eos": True})
            assert first.versions == [0] * 8
            assert max(abs(a - b) for a, b in zip(_hf_logprobs(base, PROMPT, first.token_ids), first.logprobs)) < 1e-4

            await g.update_weights(1, str(tmp_path / "v1"))
            after = await g.generate(PROMPT, {"max_tokens": 8, "temperature": 0.0, "ignore_eos": True})
            assert after.versions == [1] * 8 and g.version == 1
            assert max(abs(a - b) for a, b in zip(_hf_logprobs(perturbed, PROMPT, after.token_ids), after.logprobs)) < 1e-4
        finally:
            await g.shutdown()
        assert not _engine_processes(others)

    asyncio.run(main())
