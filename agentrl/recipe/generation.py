"""Generation: the generators (vLLM engines or servers) and the rollout workers that sample episodes on them.

Sections of the recipe (:class:`agentrl.config.Recipe`); import them from :mod:`agentrl.config`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, NonNegativeInt, model_validator

from agentrl.recipe.section import Section

__all__ = ["GeneratorConfig", "RolloutConfig", "GPU_STARTUP_TIMEOUT_S"]


GPU_STARTUP_TIMEOUT_S = 1800.0
"""``generator.startup_timeout_s`` of a GPU generator when the recipe leaves it unset, seconds."""


class GeneratorConfig(Section):
    """The vLLM generators."""

    backend: Literal["vllm", "http"] = "vllm"
    """``vllm``: each generator is a vLLM engine inside a Ray actor; ``http``: each is a client of
    a vLLM server started elsewhere (``VLLM_SERVER_DEV_MODE=1 vllm serve MODEL
    --enable-scale-out --logprobs-mode processed_logprobs``), one per entry of ``urls``; token ids in and out, weight versions
    loaded in flight through the server's RL endpoints (the server must see the run
    directory's ``weights/`` at the same path)."""
    urls: list[str] = []
    """Server base URLs for ``backend = "http"`` (e.g. ``["http://gpu-3:8000"]``)."""
    num_generators: int = Field(1, gt=0)
    """How many generator actors (each one vLLM engine; with ``http``: ``len(urls)``)."""
    max_model_len: int = Field(2048, gt=0)
    """Longest sequence (prompt + generated) the engine accepts, tokens."""
    kv_cache_gib: float = Field(1.0, gt=0)
    """KV-cache size per engine, GiB (CPU: host memory; GPU: ``gpu_memory_utilization`` is used instead)."""
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1)
    """Fraction of GPU memory per engine (GPU machines only)."""
    tensor_parallel_size: int = Field(1, gt=0)
    """GPUs per engine (tensor parallelism; GPU machines only). The engine's workers run as
    processes of the generator actor, which must then hold as many GPUs (``num_gpus``)."""
    max_num_seqs: int | None = Field(None, gt=0)
    """Most requests one engine schedules at once (vLLM's ``max_num_seqs``; None: vLLM's
    default). Set it near the episodes each engine receives (``rollout.num_workers *
    max_concurrent_episodes / num_generators``), or the rest queue inside vLLM."""
    max_num_batched_tokens: int | None = Field(None, gt=0)
    """Most tokens one engine step processes (vLLM's ``max_num_batched_tokens``; None: vLLM's
    default, and ``max(max_model_len, 4096)`` on CPU, where prefills are not chunked)."""
    enforce_eager: bool = True
    """Disable CUDA graphs / compilation (faster start-up; recommended for tiny models and CPU)."""
    enable_prefix_caching: bool = True
    """Reuse KV cache across requests that share a prefix (groups share their prompt)."""
    block_size: int | None = Field(None, gt=0)
    """KV-cache block size, tokens. Prefix caching reuses whole blocks only, so a later turn of
    an episode recomputes whatever of its history does not fill a block. None = 32 on CPU
    (vLLM-CPU's own default, 128, re-prefills short episodes' whole history every turn) and
    vLLM's default on GPUs (16)."""
    num_cpus: float = Field(1.0, gt=0)
    """Ray CPUs reserved per generator actor."""
    num_gpus: float = Field(0.0, ge=0)
    """Ray GPUs reserved per generator actor (0 on CPU machines; at least ``tensor_parallel_size``)."""
    resources: dict[str, float] = {}
    """Custom Ray resources each generator actor requires (places generators on the nodes that
    offer them, e.g. ``{gen_node = 1}`` for nodes started with ``--resources``)."""
    cpu_threads_bind: str = Field("auto", pattern=r"^(auto|nobind|all|\d+(-\d+)?(,\d+(-\d+)?)*(\|\d+(-\d+)?(,\d+(-\d+)?)*)*)$")
    """Where a CPU engine's OpenMP threads run (``VLLM_CPU_OMP_THREADS_BIND``): ``auto`` (vLLM's
    choice: one thread per core but one, kept for the rest), ``all`` (every core the generator's
    process may use: colocated's default, the engine has the machine while it generates),
    ``nobind``, or a core list like ``0-1`` or ``0,2`` (``|`` between tensor-parallel ranks). It decides over a
    ``VLLM_CPU_OMP_THREADS_BIND`` in the environment."""
    cpu_engine_processes: Literal["auto", 1, 2] = "auto"
    """Processes each CPU engine runs in: 2 (vLLM's CPU default: an engine core and a model worker) or 1
    (the worker inside the engine core, its OpenMP threads set up from ``cpu_threads_bind``): one
    process start and one torch and vLLM import fewer, so the engine is ready sooner, and it decoded
    no slower where measured (benchmarks/RESULTS.md, "Engine start-up"). One process holds one
    worker: not with ``tensor_parallel_size > 1``. ``auto``: 1 when the engine has one worker
    (``tensor_parallel_size = 1``, no ``|`` in ``cpu_threads_bind``), else 2. Ignored on GPUs."""
    cpu_affinity: list[NonNegativeInt] | None = Field(None, min_length=1)
    """Pin each generator actor to these CPU cores (Linux CPU affinity: every thread of the actor's process,
    inherited by the processes it starts: vLLM's engine processes); None: not pinned. Gives generation and
    training cores of their own on one machine (``benchmarks/async_vs_sync.py --split``)."""
    timeout_s: float = Field(300.0, gt=0)
    """Longest wait for one generation call or a weight update, seconds."""
    startup_timeout_s: float = Field(600.0, gt=0)
    """Longest wait for an engine to start, seconds. Unset, 600 on CPU and 1800 when ``num_gpus >
    0``: a first GPU start downloads the weights (15 GB for a 7B model, shared by every engine on
    the node), loads them, compiles and captures CUDA graphs; a start that fails for being slow
    costs more than a stuck one waiting 30 minutes."""
    weight_sync: Literal["disk", "nccl", "gloo", "ipc"] = "disk"
    """How each new weight version reaches the generators. ``disk``: the learner writes a
    safetensors folder, the generators reload it in flight. ``nccl`` (GPUs; learner and
    generators on different devices) or ``gloo`` (any machine): learner rank 0 broadcasts the
    parameters straight into the vLLM workers through vLLM's weight-transfer engine, nothing is
    written. ``ipc`` (GPUs, ``placement.mode = "colocated"``: generator i on learner rank i's
    GPU): each rank shares its gathered parameters by CUDA IPC handles and the vLLM worker on the
    same GPU loads them from the learner's memory, in chunks of at least 1 GiB. A transfer that
    fails or times out is reported and the run goes on with ``disk``."""
    recompute_kv_on_update: bool = True
    """At each weight update drop the engine's KV cache, so requests in flight re-encode their
    context with the new weights: each token's version label is then exact (sampled by those
    weights over a context they encoded). False skips the re-prefill (a shorter stall); tokens
    after an update then see a context encoded by the previous weights (behaviour log-probs stay
    exact, the version label is approximate)."""
    weight_sync_timeout_s: float = Field(300.0, gt=0)
    """Longest wait for forming the transfer group and for each collective, seconds."""


    @model_validator(mode="before")
    @classmethod
    def _gpu_startup_timeout(cls, data: Any) -> Any:
        """``startup_timeout_s`` left unset on a GPU generator: :data:`GPU_STARTUP_TIMEOUT_S`."""
        if isinstance(data, dict) and "startup_timeout_s" not in data:
            try:
                gpus = float(data.get("num_gpus", 0) or 0)
            except (TypeError, ValueError):
                return data  # the field's own validation names the bad num_gpus
            if gpus > 0:
                return {**data, "startup_timeout_s": GPU_STARTUP_TIMEOUT_S}
        return data

    @model_validator(mode="after")
    def _check_backend(self) -> GeneratorConfig:
        if self.backend == "http" and not self.urls:
            raise ValueError('backend = "http" needs urls (the vLLM servers\' base URLs)')
        if self.backend == "vllm" and self.urls:
            raise ValueError('urls are only used with backend = "http"')
        if self.backend == "http" and self.weight_sync != "disk":
            raise ValueError(f'weight_sync = "{self.weight_sync}" needs backend = "vllm" (http generators load versions from disk)')
        if self.tensor_parallel_size > 1 and self.num_gpus < self.tensor_parallel_size:
            raise ValueError(
                f"tensor_parallel_size = {self.tensor_parallel_size} needs num_gpus = {self.tensor_parallel_size} "
                f"(num_gpus is per generator: its engine's workers must see every GPU they shard over; got {self.num_gpus:g})"
            )
        if self.cpu_engine_processes == 1 and self.tensor_parallel_size > 1:
            raise ValueError(f"cpu_engine_processes = 1 holds one model worker; tensor_parallel_size = {self.tensor_parallel_size} needs one per rank")
        return self

    def engine_processes(self) -> int:
        """``cpu_engine_processes`` with ``auto`` decided: 1 for an engine of one worker, else 2."""
        if self.cpu_engine_processes != "auto":
            return self.cpu_engine_processes
        return 1 if self.tensor_parallel_size == 1 and "|" not in self.cpu_threads_bind else 2


class RolloutConfig(Section):
    """How episodes are played."""

    num_workers: int = Field(1, gt=0)
    """Rollout worker actors (each plays many episodes concurrently)."""
    group_size: int = Field(4, gt=0)
    """Samples per prompt (a group, for group-relative advantages)."""
    max_concurrent_episodes: int = Field(64, gt=0)
    """Episodes in flight per worker."""
    max_new_tokens: int = Field(128, gt=0)
    """Most tokens the model may write in one turn."""
    max_episode_tokens: int = Field(1024, gt=0)
    """Most tokens in a whole episode (prompt, turns, tool outputs); beyond it the episode ends
    with status ``overflow``."""
    temperature: float = Field(1.0, gt=0)
    """Sampling temperature (> 0). The learner divides its logits by it, so that its log-probs
    and vLLM's (processed: after temperature) are of the same distribution."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling threshold. Below 1 the behaviour log-probs are those of the truncated,
    renormalised distribution, while the learner's are of the whole tempered one: importance
    weights then carry the nucleus mass (as in verl); keep 1 for exact ratios."""
    seed_sampling: bool = False
    """Seed every turn's sampling from (``seed``, prompt, sample, turn): episodes are then
    reproducible (a sync run and an async run at ``max_staleness = 0`` train the same tokens),
    but vLLM samples seeded requests on its slower per-request path. Off: vLLM's batched
    sampling, episodes differ between runs."""
    stop: list[str] = ["</code>"]
    """Stop strings that end a turn (kept in the output), e.g. the end of a tool call."""
    num_cpus: float = Field(0.5, gt=0)
    """Ray CPUs reserved per rollout worker."""
    max_restarts: int = Field(2, ge=0)
    """Times a run replaces a rollout worker whose process died (killed, out of memory, crashed)
    with a new one of the same settings; its groups in flight are re-issued. 0: a dead worker
    ends the run."""
    cpu_affinity: list[NonNegativeInt] | None = Field(None, min_length=1)
    """Pin each rollout worker to these CPU cores (Linux CPU affinity: every thread of the actor's process,
    inherited by the processes it starts: its sandboxes); None: not pinned. Gives generation and
    training cores of their own on one machine (``benchmarks/async_vs_sync.py --split``)."""
    episode_timeout_s: float = Field(3600.0, gt=0)
    """Longest wait for one group of episodes, seconds: all its samples, every turn, tool calls
    included, on an engine shared with every other episode in flight. A group that runs out is
    cancelled (its remote task too) and its prompt re-issued."""
