"""How agentrl configures a vLLM engine: its settings (:class:`EngineSettings`), the engine
arguments they make on a GPU or CPU machine (:func:`engine_kwargs`), and the environment its
processes start with on CPU (OpenMP threads and their binding, one process or two:
:func:`engine_environ`, :func:`environ_set`).
:class:`~agentrl.engine.generation.generator.VllmGenerator` starts the engine with them."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import Any, Iterator

from agentrl.engine.generation.vllm_worker import WORKER_EXTENSION
from agentrl.errors import GeneratorError

__all__ = ["CPU_BLOCK_SIZE", "EngineSettings", "engine_environ", "engine_kwargs", "environ_set", "omp_threads_bind", "one_process_openmp_env"]


@dataclass
class EngineSettings:
    """Arguments of one vLLM engine (plain values; :func:`agentrl.engine.wiring.engine_settings`
    reads them from the recipe)."""

    model: str
    """Hugging Face folder or hub id."""
    tokenizer: str | None = None
    """Where the tokenizer comes from when ``model`` is a bare weights folder (None = ``model``)."""
    dtype: str = "float32"
    """Parameter dtype."""
    max_model_len: int = 2048
    """Longest sequence in tokens."""
    kv_cache_gib: float = 1.0
    """KV-cache size on CPU (GiB)."""
    gpu_memory_utilization: float = 0.85
    """Fraction of GPU memory (GPU only)."""
    enforce_eager: bool = True
    """No CUDA graphs / compilation."""
    enable_prefix_caching: bool = True
    """Share KV cache between requests with a common prefix."""
    block_size: int | None = None
    """KV-cache block size in tokens; prefix caching reuses whole blocks only. None = 32 on CPU
    (:data:`CPU_BLOCK_SIZE`) and vLLM's own default on GPUs (16)."""
    cpu_threads_bind: str = "auto"
    """Where a CPU engine's OpenMP threads run: a ``VLLM_CPU_OMP_THREADS_BIND`` value, or ``all`` (every
    core of this process's affinity, :func:`omp_threads_bind`). It decides over the variable in the
    environment, which the engine is started with for its start only."""
    cpu_engine_processes: int = 2
    """Processes a CPU engine runs in besides its caller's: 2 (vLLM's CPU default: an engine-core
    process and a model-worker process) or 1 (the model worker inside the engine core: one
    process start and one torch and vLLM import fewer; its OpenMP threads are set up from
    ``cpu_threads_bind`` as vLLM sets up its own worker's, :func:`one_process_openmp_env`).
    Ignored on GPUs. A recipe's ``auto`` (its default) arrives here decided: 1 for an engine of
    one worker."""
    seed: int = 0
    """Engine seed."""
    weight_transfer: str | None = None
    """Collective weight-sync backend (``nccl`` or ``gloo``, see
    :mod:`agentrl.engine.generation.weight_transfer`); None = versions are loaded from disk only."""
    recompute_kv_on_update: bool = True
    """At each weight update, drop the KV cache: requests in flight re-prefill their context
    with the new weights, so every token labelled with a version was sampled by exactly those
    weights (over a context encoded by them). False keeps the cache: no re-prefill, but tokens
    after an update are sampled by the new weights over a context encoded by the old ones (their
    behaviour log-probs stay exact; their version label is then approximate)."""
    max_lora_rank: int | None = None
    """Serve LoRA adapters of rank up to this (one of vLLM's allowed values); None: no LoRA.
    Weight versions are then adapters (see :meth:`VllmGenerator.update_weights`)."""
    max_loras: int = 4
    """Adapters one engine batch may mix (versions in flight at once)."""
    sleep_mode: bool = False
    """Colocated placement on a GPU: start vLLM with sleep mode, so that :meth:`VllmGenerator.sleep`
    frees the device for the learner (ignored on CPU, where vLLM has no sleep mode)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Further ``AsyncEngineArgs`` keyword arguments, passed through."""


CPU_BLOCK_SIZE = 32
"""Block size of CPU engines unless set. vLLM-CPU's default, 128, caches prefixes in 128-token
blocks only: a multi-turn episode shorter than that re-prefilled its whole history on every turn,
and a group's shared prompt was recomputed per sample. 32 is the smallest size the CPU attention
backend prefers (multiples of 32)."""


def omp_threads_bind(setting: str) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for ``setting`` (``generator.cpu_threads_bind``): vLLM's own
    values (``auto``, ``nobind``, core lists like ``0-1``) as they are; ``all``, which vLLM does
    not know: every core this process may run on (its CPU affinity), as a core list (``0,1``)."""
    if setting != "all":
        return setting
    return ",".join(str(core) for core in sorted(os.sched_getaffinity(0)))


def _core_list(text: str) -> list[int]:
    """The cores of a core list like ``0-2,5`` (``[0, 1, 2, 5]``)."""
    cores: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        cores.extend(range(int(first), int(last or first) + 1))
    return cores


def one_process_openmp_env(bind: str) -> dict[str, str]:
    """The OpenMP environment of a one-process CPU engine (``cpu_engine_processes = 1``), whose
    model worker runs in the engine-core process, for ``bind`` (a ``VLLM_CPU_OMP_THREADS_BIND``
    value, :func:`omp_threads_bind`): what vLLM's multiprocess executor gives its own worker
    process. ``OMP_NUM_THREADS`` threads (as many as the bound cores; ``nobind``: every core of
    this process's affinity, unbound) placed on those cores (``OMP_PLACES``, ``OMP_PROC_BIND``);
    ``auto``: every core of the affinity but the first, which vLLM keeps for the rest (all of
    them when there is one). Without it the in-process worker computes on every core of the
    process whatever the binding says (vLLM sets no binding for it).

    Raises:
        GeneratorError: ``bind`` names cores for several tensor-parallel ranks (``|``): one
            process holds one worker.
    """
    if "|" in bind:
        raise GeneratorError(f"generator.cpu_threads_bind = {bind!r} binds several tensor-parallel workers: "
                             "a one-process engine (cpu_engine_processes = 1) has one")
    affinity = sorted(os.sched_getaffinity(0))
    if bind == "nobind":
        return {"OMP_NUM_THREADS": str(len(affinity))}
    cores = (affinity[1:] or affinity) if bind == "auto" else _core_list(bind)
    return {"OMP_NUM_THREADS": str(len(cores)), "OMP_PLACES": "{" + ",".join(map(str, cores)) + "}", "OMP_PROC_BIND": "true"}


@contextlib.contextmanager
def environ_set(values: dict[str, str | None]) -> Iterator[None]:
    """Each environment variable of ``values`` set to its value (None: left as it is) for the
    ``with`` block, then put back as it was (removed if it was not set)."""
    before = {name: os.environ.get(name) for name, value in values.items() if value is not None}
    os.environ.update({name: value for name, value in values.items() if value is not None})
    try:
        yield
    finally:
        for name, old in before.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


def engine_environ(s: EngineSettings, on_gpu: bool) -> dict[str, str | None]:
    """The environment the engine's processes start with (for :func:`environ_set` around the
    engine's start; None: left as it is). On CPU: ``VLLM_CPU_OMP_THREADS_BIND`` from
    ``cpu_threads_bind`` and, for a one-process engine, the uni executor's switch and its worker's
    OpenMP set-up (:func:`one_process_openmp_env`). On GPUs, with ``weight_transfer = "ipc"``:
    ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``, which lets the engine's worker unpickle the learner's
    CUDA IPC handles (``ipc_handles_pickled``); the engine's processes inherit it at their start,
    and the process that starts them keeps refusing pickled messages (``AsyncLLM`` always runs
    its engine core, and so the worker, in a process of its own)."""
    if on_gpu:
        return {"VLLM_ALLOW_INSECURE_SERIALIZATION": "1"} if s.weight_transfer == "ipc" else {}
    bind = omp_threads_bind(s.cpu_threads_bind)
    env: dict[str, str | None] = {"VLLM_CPU_OMP_THREADS_BIND": bind}
    if s.cpu_engine_processes == 1:
        env.update({"VLLM_ENABLE_V1_MULTIPROCESSING": "0", **one_process_openmp_env(bind)})
    return env


def engine_kwargs(s: EngineSettings, on_gpu: bool) -> dict[str, Any]:
    """``AsyncEngineArgs`` keyword arguments for ``s`` on a GPU (``on_gpu``) or CPU machine."""
    kwargs: dict[str, Any] = {
        "model": s.model,
        "tokenizer": s.tokenizer or s.model,
        "dtype": s.dtype,
        "max_model_len": s.max_model_len,
        "enforce_eager": s.enforce_eager,
        "enable_prefix_caching": s.enable_prefix_caching,
        "seed": s.seed,
        "gpu_memory_utilization": s.gpu_memory_utilization,
    }
    if s.block_size is not None:
        kwargs["block_size"] = s.block_size
    if not on_gpu:
        del kwargs["gpu_memory_utilization"]
        # An explicit KV-cache size: vLLM-CPU's default is a fraction of host memory
        # (NUMA node 0 only), which fails when anything else runs on the machine.
        kwargs["kv_cache_memory_bytes"] = int(s.kv_cache_gib * 2**30)
        # vLLM-CPU 0.32 crashes ("CPU Generator does not use offset") when a request with a
        # per-request seed is prefilled in chunks; seeded sampling is how episodes stay
        # reproducible, so prefills are scheduled whole on CPU.
        kwargs["enable_chunked_prefill"] = False
        kwargs["max_num_batched_tokens"] = max(s.max_model_len, 4096)
        kwargs.setdefault("block_size", CPU_BLOCK_SIZE)
        if s.cpu_engine_processes == 1:  # the worker inside the engine core (engine_environ)
            kwargs["distributed_executor_backend"] = "uni"
    if s.weight_transfer is not None:
        kwargs["weight_transfer_config"] = {"backend": s.weight_transfer}
    if s.sleep_mode and on_gpu:
        kwargs["enable_sleep_mode"] = True
    if s.max_lora_rank is not None:
        kwargs.update(enable_lora=True, max_lora_rank=s.max_lora_rank, max_loras=s.max_loras, max_cpu_loras=s.max_loras)
    kwargs["worker_extension_cls"] = WORKER_EXTENSION  # agentrl's worker methods (tied embeddings)
    kwargs["use_tqdm_on_load"] = False  # no progress bar at every weight reload
    # the log-probs of the distribution tokens are sampled from (after temperature and
    # top-k/top-p), not of the raw logits: the behaviour policy of the importance weights
    kwargs["logprobs_mode"] = "processed_logprobs"
    return {**kwargs, **s.extra}
