"""Generator bookkeeping that needs no engine: busy time and version spans."""

import asyncio
import os
from collections.abc import Callable
from typing import Any

import pytest

from agentrl.engine.generation import engine_config
from agentrl.engine.generation import generator as gen_mod
from agentrl.engine.generation.generator import EngineSettings, VllmGenerator, versions_from_spans


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_busy_time_counts_overlapping_requests_once(monkeypatch) -> None:
    clock = Clock()
    monkeypatch.setattr(gen_mod.time, "monotonic", clock)
    g = VllmGenerator(EngineSettings(model="unused"))
    a, b, c = g.busy, g.busy, g.busy
    a.__enter__()  # request A at t=100
    clock.now = 101.0
    b.__enter__()  # request B overlaps
    clock.now = 103.0
    a.__exit__(None, None, None)  # A done
    clock.now = 104.0
    b.__exit__(None, None, None)  # B done: busy 100..104
    clock.now = 110.0  # idle
    c.__enter__()
    clock.now = 111.5  # still in flight: counted up to now
    stats = asyncio.run(g.stats())
    assert stats["busy_s"] == 5.5
    assert stats["alive_s"] == 11.5
    assert g.busy.busy_s == 4.0


def test_versions_from_spans() -> None:
    assert versions_from_spans([("1", 0, 2), ("2", 2, 5)], 5, 0) == [1, 1, 2, 2, 2]
    assert versions_from_spans(None, 3, 7) == [7, 7, 7]


def test_engine_arguments_on_cpu_and_gpu() -> None:
    """CPU engines get an explicit KV-cache size, whole prefills and 32-token blocks (prefix
    caching at a granularity short episodes can use); GPU engines keep vLLM's defaults."""
    from agentrl.engine.generation.generator import CPU_BLOCK_SIZE, engine_kwargs

    s = EngineSettings(model="m", kv_cache_gib=0.5, max_model_len=1024)
    cpu = engine_kwargs(s, on_gpu=False)
    assert cpu["block_size"] == CPU_BLOCK_SIZE == 32 and cpu["kv_cache_memory_bytes"] == 2**29
    assert cpu["enable_chunked_prefill"] is False and "gpu_memory_utilization" not in cpu
    gpu = engine_kwargs(s, on_gpu=True)
    assert "block_size" not in gpu and gpu["gpu_memory_utilization"] == 0.85 and "kv_cache_memory_bytes" not in gpu
    assert engine_kwargs(EngineSettings(model="m", block_size=128), on_gpu=False)["block_size"] == 128
    assert engine_kwargs(EngineSettings(model="m", block_size=64), on_gpu=True)["block_size"] == 64
    extra = engine_kwargs(EngineSettings(model="m", weight_transfer="gloo", extra={"tensor_parallel_size": 2}), on_gpu=True)
    assert extra["weight_transfer_config"] == {"backend": "gloo"} and extra["tensor_parallel_size"] == 2
    # every engine carries agentrl's worker methods (re-tying a tied lm_head after an update)
    from agentrl.engine.generation.vllm_worker import WORKER_EXTENSION

    assert cpu["worker_extension_cls"] == gpu["worker_extension_cls"] == WORKER_EXTENSION


def test_every_generator_implements_the_generator_protocol():
    from agentrl.engine.generation.http_generator import HttpGenerator
    from agentrl.engine.common.interfaces import Generator
    from agentrl.engine.testing import FakeGenerator

    for cls in (VllmGenerator, HttpGenerator, FakeGenerator):
        assert Generator in cls.__mro__, cls  # declared: each names the protocol as a base
    assert isinstance(VllmGenerator(EngineSettings(model="unused")), Generator)
    assert isinstance(FakeGenerator(), Generator)


def test_all_binds_vllms_openmp_threads_to_every_core_the_process_may_use(monkeypatch) -> None:
    # vLLM reads "auto", "nobind" or a core list: "all" (colocated's default on CPUs) becomes the
    # process's affinity, so an engine placed on cores 2 and 5 binds there and nowhere else
    monkeypatch.setattr(gen_mod.os, "sched_getaffinity", lambda pid: {5, 2})
    assert engine_config.omp_threads_bind("all") == "2,5"
    assert [engine_config.omp_threads_bind(v) for v in ("auto", "nobind", "0-1")] == ["auto", "nobind", "0-1"]


class StartedEngine:
    """What ``start`` reads of a started ``AsyncLLM``."""

    class model_config:
        class hf_text_config:
            tie_word_embeddings = False

    async def update_weight_version(self, version: str) -> None:
        pass

    async def collective_rpc(self, method: str) -> list[int]:
        assert method == "agentrl_compute_threads", method
        return [3]  # one answer per worker


def fake_vllm(monkeypatch: pytest.MonkeyPatch, record: Callable[[dict[str, Any]], Any]) -> list[Any]:
    """vLLM's front end, as far as ``start()`` uses it (no vLLM import in the quick tier): each
    engine construction appends ``record(engine_args)`` to the returned list, taken while the
    start-up environment is set, and yields a :class:`StartedEngine`."""
    import sys
    import types

    seen: list[Any] = []

    class FakeAsyncLLM:
        @staticmethod
        def from_engine_args(args: dict[str, Any]) -> StartedEngine:
            seen.append(record(args))
            return StartedEngine()

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(AsyncEngineArgs=lambda **kwargs: kwargs))
    monkeypatch.setitem(sys.modules, "vllm.v1.engine.async_llm", types.SimpleNamespace(AsyncLLM=FakeAsyncLLM))
    return seen


def test_the_setting_binds_the_engine_and_the_binding_leaves_no_trace_in_the_environment(monkeypatch) -> None:
    # a process that hosts an engine (a test session, an in-process run) starts later engines and
    # `agentrl train` subprocesses: what one engine was bound to must not become theirs
    seen = fake_vllm(monkeypatch, lambda args: os.environ.get("VLLM_CPU_OMP_THREADS_BIND"))
    monkeypatch.setattr(gen_mod.os, "sched_getaffinity", lambda pid: {0, 3})
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    info = asyncio.run(VllmGenerator(EngineSettings(model="unused", cpu_threads_bind="all")).start())
    assert seen == ["0,3"] and info["cpu_threads_bind"] == "0,3"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in os.environ
    # a value already in the environment (a user's export) is put back, and the setting decides
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    info = asyncio.run(VllmGenerator(EngineSettings(model="unused", cpu_threads_bind="auto")).start())
    assert seen[-1] == "auto" and info["cpu_threads_bind"] == "auto"
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"


def test_a_one_process_engine_gets_the_uni_executor_and_vllms_worker_openmp_setup_for_its_start_only(monkeypatch) -> None:
    names = ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_ENABLE_V1_MULTIPROCESSING", "OMP_NUM_THREADS", "OMP_PLACES", "OMP_PROC_BIND")
    seen = fake_vllm(monkeypatch, lambda args: (args, {k: os.environ.get(k) for k in names}))
    for name in names:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "7")  # a user's export: put back after the start
    info = asyncio.run(VllmGenerator(EngineSettings(model="unused", cpu_threads_bind="0-2", cpu_engine_processes=1)).start())
    args, env = seen[-1]
    assert args["distributed_executor_backend"] == "uni" and info["cpu_engine_processes"] == 1 and info["torch_threads"] == 3
    assert env == {"VLLM_CPU_OMP_THREADS_BIND": "0-2", "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "3",
                   "OMP_PLACES": "{0,1,2}", "OMP_PROC_BIND": "true"}
    assert os.environ["OMP_NUM_THREADS"] == "7" and not any(k in os.environ for k in names if k != "OMP_NUM_THREADS")
    # the default: vLLM's two processes, nothing of the above
    info = asyncio.run(VllmGenerator(EngineSettings(model="unused", cpu_threads_bind="0-2")).start())
    args, env = seen[-1]
    assert "distributed_executor_backend" not in args and info["cpu_engine_processes"] == 2
    assert env == {"VLLM_CPU_OMP_THREADS_BIND": "0-2", "VLLM_ENABLE_V1_MULTIPROCESSING": None, "OMP_NUM_THREADS": "7",
                   "OMP_PLACES": None, "OMP_PROC_BIND": None}


def test_a_one_process_engines_openmp_threads_follow_the_binding(monkeypatch) -> None:
    from agentrl.errors import GeneratorError

    monkeypatch.setattr(gen_mod.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert engine_config.one_process_openmp_env("1,3") == {"OMP_NUM_THREADS": "2", "OMP_PLACES": "{1,3}", "OMP_PROC_BIND": "true"}
    assert engine_config.one_process_openmp_env("0-1,3")["OMP_PLACES"] == "{0,1,3}"
    assert engine_config.one_process_openmp_env("auto") == {"OMP_NUM_THREADS": "3", "OMP_PLACES": "{1,2,3}", "OMP_PROC_BIND": "true"}
    assert engine_config.one_process_openmp_env("nobind") == {"OMP_NUM_THREADS": "4"}
    with pytest.raises(GeneratorError, match="several tensor-parallel"):
        engine_config.one_process_openmp_env("0-1|2-3")
    monkeypatch.setattr(gen_mod.os, "sched_getaffinity", lambda pid: {5})
    assert engine_config.one_process_openmp_env("auto")["OMP_PLACES"] == "{5}"  # one core: it is the engine's
