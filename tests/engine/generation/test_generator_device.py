"""The generator takes its device from the engine's one seam
(:func:`agentrl.engine.common.devices.resolve_device`), not from ``torch.cuda.is_available()``:
an engine Ray gave no GPU on a GPU node refuses in words instead of loading onto a GPU another
actor was given (vLLM's CUDA build picks its platform from the GPUs it sees). No engine starts."""

from __future__ import annotations

import asyncio

import pytest

from agentrl.engine.common.devices import decide_device
from agentrl.engine.generation import generator as gen
from agentrl.errors import GeneratorError


class Refused(Exception):
    """Raised by the stand-in for vLLM's engine constructor: nothing is started."""


def refuse(*args, **kwargs):
    raise Refused("no engine in this test")


def test_an_engine_ray_gave_no_gpu_on_a_gpu_node_refuses_before_vllm_starts(monkeypatch):
    from vllm.v1.engine.async_llm import AsyncLLM

    monkeypatch.setattr(gen, "resolve_device", lambda: decide_device([], None, True))  # num_gpus = 0, GPUs visible
    monkeypatch.setattr(AsyncLLM, "from_engine_args", refuse)
    g = gen.VllmGenerator(gen.EngineSettings(model="some/judge"))
    with pytest.raises(GeneratorError, match=r"'some/judge' has no GPU.*num_gpus >= 1"):
        asyncio.run(g.start())


@pytest.mark.parametrize("on_gpu", [True, False])
def test_on_gpu_and_sleep_mode_follow_the_seam(monkeypatch, on_gpu):
    from vllm.v1.engine.async_llm import AsyncLLM

    seen = {}

    def record(args, *a, **k):
        seen["sleep"] = args.enable_sleep_mode
        raise Refused("no engine in this test")

    # CUDA is visible either way: Ray's assignment decides
    monkeypatch.setattr(gen, "resolve_device", lambda: decide_device(["0"] if on_gpu else None, "0", on_gpu))
    monkeypatch.setattr(AsyncLLM, "from_engine_args", record)
    g = gen.VllmGenerator(gen.EngineSettings(model="some/policy", sleep_mode=True))
    with pytest.raises(GeneratorError):
        asyncio.run(g.start())
    assert g._on_gpu is on_gpu and seen["sleep"] is on_gpu
