"""Colocated sleep and wake of a vLLM generator, at the seam: what ``VllmGenerator`` asks of
vLLM's ``AsyncLLM`` (a recording stand-in here), and that those calls exist in the installed
vLLM with the arguments used (its real signatures; no GPU is lent to this project)."""

import asyncio
import inspect

from agentrl.engine.generation.generator import EngineSettings, VllmGenerator, engine_kwargs


class RecordingEngine:
    """The ``AsyncLLM`` methods a weight update and a sleep use, recording each call."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    async def sleep(self, level: int = 1, mode: str = "abort") -> None:
        self.calls.append(("sleep", level, mode))

    async def wake_up(self, tags=None) -> bool:
        self.calls.append(("wake_up", tuple(tags or ())))
        return True

    async def pause_generation(self, mode: str = "abort", clear_cache: bool = True) -> None:
        self.calls.append(("pause",))

    async def collective_rpc(self, method, kwargs=None):
        self.calls.append(("rpc", method))

    async def update_weight_version(self, version: str) -> None:
        self.calls.append(("version", version))

    async def resume_generation(self) -> None:
        self.calls.append(("resume",))


def generator(sleep_mode: bool, on_gpu: bool) -> tuple[VllmGenerator, RecordingEngine]:
    g = VllmGenerator(EngineSettings(model="unused", sleep_mode=sleep_mode))
    g.engine = RecordingEngine()
    g._on_gpu = on_gpu  # what start() found (resolve_device(): Ray's GPUs, else CUDA)
    return g, g.engine


def test_asleep_generator_wakes_whole_before_it_loads_a_version():
    g, engine = generator(sleep_mode=True, on_gpu=True)
    asyncio.run(g.sleep(2))
    asyncio.run(g.update_weights(3, "/w/v3"))
    kinds = [c[0] for c in engine.calls]
    assert engine.calls[0] == ("sleep", 2, "wait")  # requests in flight finish first
    # vLLM resumes scheduling only once fully awake; the reload pauses and resumes it around itself
    assert engine.calls[1] == ("wake_up", ("weights", "kv_cache"))
    assert kinds.index("pause") > 1 and kinds.index("rpc") > kinds.index("pause") and kinds[-1] == "resume"
    assert g.version == 3
    engine.calls.clear()
    asyncio.run(g.update_weights(4, "/w/v4"))  # awake: no wake-up calls
    assert not [c for c in engine.calls if c[0] == "wake_up"]


def test_a_request_wakes_a_sleeping_generator_first():
    g, engine = generator(sleep_mode=True, on_gpu=True)
    asyncio.run(g.sleep(1))
    try:
        asyncio.run(g.generate([1, 2], {"max_tokens": 1}))
    except Exception:  # noqa: BLE001 - the stand-in cannot generate; the wake-up is what is checked
        pass
    assert ("wake_up", ("weights", "kv_cache")) in engine.calls


def test_sleep_is_a_no_op_without_sleep_mode_and_never_calls_vllms_sleep_on_cpu(monkeypatch):
    from agentrl.engine.generation import generator as generator_module

    stopped: list[list[int]] = []
    monkeypatch.setattr(generator_module, "freeze", lambda pids: stopped.append(pids) or pids)
    monkeypatch.setattr(generator_module, "engine_processes", lambda exclude=frozenset(): [4242])
    monkeypatch.setattr(generator_module, "start_sentinel", lambda: 0)
    g, engine = generator(sleep_mode=False, on_gpu=True)
    assert asyncio.run(g.sleep(2)) == 0.0 and engine.calls == []
    g, engine = generator(sleep_mode=True, on_gpu=False)  # colocated on CPUs: the processes stop instead
    asyncio.run(g.sleep(1))
    assert engine.calls == [] and stopped == [[4242]]
    assert "enable_sleep_mode" not in engine_kwargs(EngineSettings(model="m", sleep_mode=True), on_gpu=False)
    assert engine_kwargs(EngineSettings(model="m", sleep_mode=True), on_gpu=True)["enable_sleep_mode"] is True


def test_the_installed_vllm_has_the_sleep_api_used():
    from vllm import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    sleep = inspect.signature(AsyncLLM.sleep).parameters
    assert "level" in sleep and "mode" in sleep
    assert "wait" in str(sleep["mode"].annotation) or "PauseMode" in str(sleep["mode"].annotation)
    assert "tags" in inspect.signature(AsyncLLM.wake_up).parameters
    assert "enable_sleep_mode" in inspect.signature(AsyncEngineArgs).parameters
    from vllm.v1.engine import core

    from vllm.v1.engine import PauseMode

    assert "wait" in PauseMode.__args__  # requests in flight finish before the engine sleeps
    # a full wake-up resumes the scheduler that sleep paused
    assert "resume_scheduler" in inspect.getsource(core.EngineCore.wake_up)
