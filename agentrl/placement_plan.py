"""Where generation and training run: on devices of their own (``separate``) or taking turns on
the same devices (``colocated``), and what ``placement.mode = "auto"`` picks.

One decision for the run (:class:`agentrl.engine.controller.Controller`, from the cluster Ray
reports) and for its dry run (``agentrl check --dry-run``, from this machine or
``placement.gpus_per_node``), so that the two never disagree.

* **separate**: generators and learner ranks hold their own devices and run at the same time;
  the learner trains on samples up to ``algo.max_staleness`` versions old. Right when each side
  has hardware of its own (a GPU node split 4 + 4, a cluster).
* **colocated**: generator ``i`` and learner rank ``i`` share devices and take turns: the
  generators write one batch with the weights the learner holds, then the learner trains on it
  while the generators wait (on a GPU vLLM sleeps: its weights offloaded, its KV cache dropped),
  then the new version is loaded and the generators wake. The run is on-policy at every step
  boundary: the staleness bound in force is 0, whatever ``algo.max_staleness`` says. On CPUs
  the phase that runs gets every core: the learner trains with as many torch threads as the
  node has cores (split between the learner and the critic ranks), and vLLM's OpenMP threads are
  bound to all of them.
* **auto** (the default): colocated when the two sides would share devices (one CPU-only
  machine; GPUs too few to hold both sides apart); separate otherwise (several nodes without
  GPUs, or enough GPUs for both sides).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from agentrl.config import Recipe
from agentrl.errors import ConfigError

__all__ = [
    "ClusterShape", "MemoryPlan", "PlacementPlan", "apply_placement", "memory_plan", "model_parameters", "plan_placement",
    "step_working_set",
]

Mode = Literal["separate", "colocated"]


@dataclass(frozen=True)
class ClusterShape:
    """What the cluster offers: ``cpus`` and ``gpus`` per alive node (Ray's logical resources,
    or this machine's cores and CUDA devices); ``gpu_memory_gib``: memory of one GPU (None:
    unknown)."""

    cpus: tuple[float, ...]
    gpus: tuple[float, ...]
    gpu_memory_gib: float | None = None

    @property
    def nodes(self) -> int:
        return len(self.cpus)

    @property
    def total_gpus(self) -> float:
        return sum(self.gpus)

    @classmethod
    def from_ray_nodes(cls, nodes: list[dict[str, Any]], gpu_memory_gib: float | None = None) -> ClusterShape:
        """From ``ray.nodes()``: the alive nodes' ``Resources`` (``CPU``, ``GPU``)."""
        alive = [n for n in nodes if n.get("Alive", n.get("alive", True))]
        res = [n.get("Resources", {}) for n in alive]
        return cls(tuple(float(r.get("CPU", 0)) for r in res), tuple(float(r.get("GPU", 0)) for r in res), gpu_memory_gib)

    @classmethod
    def this_machine(cls, gpus_per_node: int | None = None, gpu_memory_gib: float | None = None) -> ClusterShape:
        """One node: this machine's usable cores and its CUDA devices (``gpus_per_node`` given:
        that many GPUs of ``gpu_memory_gib`` each, for planning a GPU machine from this one)."""
        import os

        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        gpus = gpus_per_node
        memory = gpu_memory_gib
        if gpus is None:
            gpus, found = _cuda_devices()
            memory = memory if memory is not None else found
        return cls((float(cores),), (float(gpus),), memory)


def _cuda_devices() -> tuple[int, float | None]:
    """CUDA devices here and the memory of the first (GiB); (0, None) without CUDA."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return 0, None
    if not torch.cuda.is_available():
        return 0, None
    n = torch.cuda.device_count()
    return n, torch.cuda.get_device_properties(0).total_memory / 2**30


@dataclass(frozen=True)
class MemoryPlan:
    """GPU memory of one colocated device, GiB: ``learner`` (the rank's share of parameters,
    gradients and AdamW states), ``generator`` (vLLM's reservation,
    ``generator.gpu_memory_utilization`` of the device), ``device`` (what the device has)."""

    parameters: int
    learner: float
    generator: float
    device: float
    activations: float | None = None
    """What a learner step holds beyond the states at its peak, GiB (:func:`step_working_set`);
    None when the model's shapes are unknown here (then not counted)."""
    offloaded: bool = False
    """``learner.offload_states``: the learner's states are in host memory while vLLM is awake."""
    handover: float = 0.0
    """``generator.weight_sync = "ipc"``: the learner's CUDA IPC staging buffer, GiB, held during
    a handover beside the learner's states and vLLM's woken weights (its KV cache still asleep)."""
    weights: float = 0.0
    """vLLM's weights, GiB (in ``model.dtype``): what a handover wakes."""

    @property
    def peak(self) -> float:
        """The most both sides hold at once: vLLM awake beside the learner's states (they stay
        on the GPU unless offloaded), the learner training while vLLM sleeps (weights offloaded, KV cache
        dropped: about nothing left), or an IPC handover (vLLM's weights and the staging
        buffer beside the learner's states)."""
        beside_vllm = 0.0 if self.offloaded else self.learner
        training = self.learner + (self.activations or 0.0)
        return max(self.generator + beside_vllm, training, self.learner + self.weights + self.handover)

    def fits(self) -> bool:
        return self.peak <= self.device

    def lines(self) -> list[str]:
        return [
            f"model: {self.parameters / 1e9:.2f} B parameters",
            f"learner rank: {self.learner:.1f} GiB (parameters, gradients, AdamW)"
            + (", in host memory while vLLM generates (learner.offload_states)" if self.offloaded else ""),
            (f"learner step: {self.activations:.1f} GiB more at its peak (activations of learner.micro_batch_tokens, "
             "one unsharded layer and the embeddings, a chunk of logits: an estimate)" if self.activations is not None
             else "learner step: activations not counted (the model's config.json is not here)"),
            f"vLLM: {self.generator:.1f} GiB (generator.gpu_memory_utilization of {self.device:.0f} GiB), asleep while the learner trains",
            *([f"ipc handover: {self.handover:.1f} GiB staging buffer beside vLLM's {self.weights:.1f} GiB of weights"] if self.handover else []),
            f"peak: {self.peak:.1f} GiB of {self.device:.0f} GiB" + ("" if self.fits() else "  <- does not fit"),
        ]


@dataclass(frozen=True)
class PlacementPlan:
    """The placement in force.

    ``mode``: ``separate`` or ``colocated``; ``reason``: why, in words (``auto`` says what it
    saw); ``max_staleness``: the staleness bound in force; ``torch_threads``: the learner's and
    ``critic_threads`` the critic's torch threads per rank (None: the recipe's); ``cpu_threads_bind``:
    vLLM-CPU's OpenMP binding (None: the recipe's); ``on_gpu``: the devices are GPUs;
    ``memory``: the memory plan of one colocated GPU (None on CPU, or when the GPU's size is
    unknown)."""

    mode: Mode
    reason: str
    max_staleness: int
    on_gpu: bool = False
    torch_threads: int | None = None
    critic_threads: int | None = None
    cpu_threads_bind: str | None = None
    memory: MemoryPlan | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def colocated(self) -> bool:
        return self.mode == "colocated"

    def lines(self) -> list[str]:
        """The plan in words: the run's first lines and the dry run's."""
        out = [f"placement: {self.mode} ({self.reason})"]
        if self.colocated:
            out.append(f"  generation and training take turns; on-policy at each step (max_staleness {self.max_staleness})")
            if self.torch_threads is not None:
                out.append(f"  learner: {self.torch_threads} torch thread(s) per rank; vLLM OpenMP threads bound to {self.cpu_threads_bind}")
            if self.memory is not None:
                out.extend(f"  {line}" for line in self.memory.lines())
        out.extend(f"  {n}" for n in self.notes)
        return out


def plan_placement(recipe: Recipe, cluster: ClusterShape) -> PlacementPlan:
    """The placement of ``recipe`` on ``cluster`` (``placement.mode`` resolved); raises
    :class:`ConfigError` naming the keys when the recipe cannot be placed that way."""
    p = recipe.placement
    g, lc = recipe.generator, recipe.learner
    gpu = g.num_gpus > 0 or lc.num_gpus > 0
    mode: Mode
    if p.mode == "auto":
        mode, reason = _auto(recipe, cluster, gpu)
    else:
        mode, reason = p.mode, "placement.mode"
    if g.weight_sync == "ipc" and not gpu:
        raise ConfigError('generator.weight_sync = "ipc" is CUDA IPC between a learner rank and the generator on its GPU: '
                          'this recipe has no GPUs (generator.num_gpus and learner.num_gpus are 0); use "gloo" or "disk"')
    if lc.offload_states and not gpu:
        raise ConfigError("learner.offload_states frees GPU memory for colocated generators: this recipe has no GPUs "
                          "(learner.num_gpus and generator.num_gpus are 0); remove it")
    if mode == "separate":
        if lc.offload_states:
            raise ConfigError(f"learner.offload_states is for colocated placement, where vLLM takes the learner's GPU in turns; "
                              f"{reason} chose separate devices: remove it")
        if g.weight_sync == "ipc":
            raise ConfigError(f'generator.weight_sync = "ipc" needs each generator on its learner rank\'s GPU '
                              f'(placement.mode = "colocated"); {reason} chose separate devices: use "nccl" there')
        return PlacementPlan("separate", reason, recipe.max_staleness, on_gpu=gpu)
    _check_colocated(recipe, cluster, gpu)
    notes = []
    if recipe.mode != "sync" and recipe.algo.max_staleness > 0 and "max_staleness" in recipe.algo.model_fields_set:
        notes.append(f"algo.max_staleness = {recipe.algo.max_staleness} does not apply: colocated runs train on-policy")
    if gpu:
        memory = memory_plan(recipe, cluster.gpu_memory_gib) if cluster.gpu_memory_gib else None
        if memory is not None and not memory.fits():
            raise ConfigError(
                "placement.mode = colocated: one GPU cannot hold both sides: " + "; ".join(memory.lines())
                + ". Lower generator.gpu_memory_utilization, use [lora], "
                "add learner ranks (FSDP shards the states), or use more GPUs with placement.mode = \"separate\""
            )
        if memory is None:
            notes.append("GPU memory unknown here: the memory plan is checked when the run starts (or set placement.gpu_memory_gib)")
        return PlacementPlan("colocated", reason, 0, on_gpu=True, memory=memory, notes=notes)
    cores = max(1, int(min(cluster.cpus) if cluster.cpus else 1))
    ranks = lc.num_ranks + (recipe.critic_settings.num_ranks if recipe.algo.advantage == "gae" else 0)
    threads = max(1, cores // ranks)
    set_ = lc.model_fields_set
    learner_threads = lc.torch_threads if "torch_threads" in set_ and lc.torch_threads > 1 else threads
    critic_threads = recipe.critic_settings.torch_threads if recipe.critic is not None and "torch_threads" in recipe.critic.model_fields_set else threads
    bind = g.cpu_threads_bind if "cpu_threads_bind" in g.model_fields_set else "all"
    return PlacementPlan("colocated", reason, 0, torch_threads=learner_threads, critic_threads=critic_threads,
                         cpu_threads_bind=bind, notes=notes)


def _auto(recipe: Recipe, cluster: ClusterShape, gpu: bool) -> tuple[Mode, str]:
    g, lc = recipe.generator, recipe.learner
    if g.backend == "http":
        return "separate", "auto: the generators are vLLM servers elsewhere (generator.backend = \"http\")"
    if not gpu:
        if cluster.nodes > 1:
            return "separate", f"auto: {cluster.nodes} nodes, generation and training can have machines of their own"
        return "colocated", f"auto: one machine without GPUs ({cluster.cpus[0]:g} cores): both sides would share its cores"
    if g.weight_sync == "ipc":
        return "colocated", "auto: generator.weight_sync = \"ipc\" shares each learner rank's GPU with a generator"
    need = g.num_generators * g.num_gpus + lc.num_ranks * lc.num_gpus
    if recipe.algo.advantage == "gae":
        need += recipe.critic_settings.num_ranks * recipe.critic_settings.num_gpus
    have = cluster.total_gpus
    if have >= need:
        return "separate", f"auto: {have:g} GPUs hold generators and learner apart (they need {need:g})"
    return "colocated", f"auto: {have:g} GPU(s) cannot hold generators and learner apart (they need {need:g})"


def _check_colocated(recipe: Recipe, cluster: ClusterShape, gpu: bool) -> None:
    g, lc = recipe.generator, recipe.learner
    if g.backend == "http":
        raise ConfigError('placement.mode = "colocated" needs vLLM generators of the run (generator.backend = "vllm"); '
                          'http generators are servers elsewhere: use placement.mode = "separate"')
    if not gpu:
        return  # every process shares the cores of its node, and takes its turn with them
    if g.tensor_parallel_size != 1:
        raise ConfigError(f"placement.mode = \"colocated\" on GPUs places generator i on learner rank i's GPU: "
                          f"generator.tensor_parallel_size must be 1 (got {g.tensor_parallel_size})")
    if g.num_generators != lc.num_ranks:
        raise ConfigError(f"placement.mode = \"colocated\" on GPUs pairs generator i with learner rank i on one GPU: "
                          f"generator.num_generators ({g.num_generators}) must equal learner.num_ranks ({lc.num_ranks})")
    if g.num_gpus > 1 or lc.num_gpus > 1:
        raise ConfigError(f"placement.mode = \"colocated\": generator.num_gpus ({g.num_gpus:g}) and learner.num_gpus "
                          f"({lc.num_gpus:g}) must be at most 1 (each pair shares one GPU)")
    if cluster.gpus and cluster.total_gpus < lc.num_ranks:
        raise ConfigError(f"placement.mode = \"colocated\": learner.num_ranks = {lc.num_ranks} needs {lc.num_ranks} GPUs "
                          f"(one per generator/rank pair); the cluster has {cluster.total_gpus:g}")
    if g.weight_sync == "nccl":
        raise ConfigError('placement.mode = "colocated": generator.weight_sync = "nccl" would broadcast from a GPU to itself; '
                          'use "ipc" (vLLM maps the learner\'s GPU memory) or "disk" (the learner writes the version, vLLM wakes and loads it)')
    others = gpus_of_their_own(recipe)
    if others and cluster.gpus and cluster.total_gpus < lc.num_ranks + sum(others.values()):
        asks = ", ".join(f"{key} = {n:g}" for key, n in others.items())
        raise ConfigError(
            f"placement.mode = \"colocated\" on GPUs: the {lc.num_ranks} generator/learner pair(s) take "
            f"{lc.num_ranks} GPU(s), and beside them {asks} GPU(s) of their own (only the generators and the learner "
            f"share a GPU); the cluster has {cluster.total_gpus:g}. Use more GPUs, critic.allow_cpu = true with "
            "critic.num_gpus = 0, or the policy as judge (reward.judge.model = \"policy\")"
        )


def gpus_of_their_own(recipe: Recipe) -> dict[str, float]:
    """GPUs the recipe's other GPU actors ask for, by the recipe keys that ask (``"critic.num_ranks *
    critic.num_gpus"``: PPO's critic ranks; ``"reward.judge.num_generators * reward.judge.num_gpus"``:
    a separate judge model's generators; ``"reward.model.num_gpus"``: the reward model). Colocated,
    these get placements of their own beside the generator/learner pairs' GPUs; absent: none."""
    out: dict[str, float] = {}
    c = recipe.critic_settings
    if recipe.algo.advantage == "gae" and recipe.mode in ("async", "sync") and c.num_gpus > 0:
        out["critic.num_ranks * critic.num_gpus"] = c.num_ranks * c.num_gpus
    j = recipe.reward.judge
    if j is not None and j.model != "policy" and j.num_gpus > 0:
        out["reward.judge.num_generators * reward.judge.num_gpus"] = j.num_generators * j.num_gpus
    m = recipe.reward.model
    if m is not None and m.num_gpus > 0:
        out["reward.model.num_gpus"] = m.num_gpus
    return out


def model_parameters(config: dict[str, Any]) -> int:
    """The parameter count of a decoder-only transformer from its Hugging Face ``config.json``
    (embeddings, attention with grouped KV heads, a gated MLP, norms; exact for Llama/Qwen2-style
    models up to biases)."""
    h = int(config["hidden_size"])
    layers = int(config["num_hidden_layers"])
    vocab = int(config["vocab_size"])
    inter = int(config.get("intermediate_size", 4 * h))
    heads = int(config.get("num_attention_heads", 1))
    head_dim = int(config.get("head_dim") or h // heads)
    kv = int(config.get("num_key_value_heads", heads))
    attn = h * heads * head_dim * 2 + h * kv * head_dim * 2
    mlp = 3 * h * inter
    embed = vocab * h * (1 if config.get("tie_word_embeddings", False) else 2)
    return embed + layers * (attn + mlp + 2 * h) + h


def _read_config(model: str) -> dict[str, Any] | None:
    path = Path(model).expanduser() / "config.json"
    if path.is_file():
        return json.loads(path.read_text())
    try:  # a hub id: the config from the local cache only (never a download here)
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(model, "config.json")
    except Exception:
        return None
    return json.loads(Path(cached).read_text()) if isinstance(cached, str) else None


KNOWN_SIZES = {"qwen/qwen2.5-0.5b-instruct": 494_032_768, "qwen/qwen2.5-1.5b-instruct": 1_543_714_304,
               "qwen/qwen2.5-3b-instruct": 3_085_938_688, "qwen/qwen2.5-7b-instruct": 7_615_616_512}
"""Parameter counts of common hub models (from their model cards), for planning a GPU run on a
machine that has not downloaded them."""

KNOWN_SHAPES: dict[str, dict[str, Any]] = {
    "qwen/qwen2.5-0.5b-instruct": {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                                   "vocab_size": 151936, "tie_word_embeddings": True},
    "qwen/qwen2.5-1.5b-instruct": {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
                                   "vocab_size": 151936, "tie_word_embeddings": True},
    "qwen/qwen2.5-3b-instruct": {"hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
                                 "vocab_size": 151936, "tie_word_embeddings": True},
    "qwen/qwen2.5-7b-instruct": {"hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
                                 "vocab_size": 152064, "tie_word_embeddings": False},
}
"""The shapes :func:`step_working_set` needs, from the same models' ``config.json``."""


def step_working_set(config: dict[str, Any], *, micro_batch_tokens: int, logprob_chunk_tokens: int,
                     checkpointing: bool, compute_bytes: int) -> int:
    """Bytes a learner rank holds during a step beyond its parameters, gradients and AdamW
    states, at the peak of a micro-batch's backward pass (``T`` = ``micro_batch_tokens``, ``h``
    the hidden size, ``I`` the MLP's, ``L`` layers, ``V`` the vocabulary, ``b`` the compute
    dtype's bytes):

    - the layers' activations: with activation checkpointing each layer keeps its input
      (``L·T·h·b``) and one layer at a time is recomputed (``T·(6h + 4I)·b``: norms, q/k/v,
      attention output, the gated MLP's three products); without, every layer keeps all of it;
    - the unsharded compute copy of the largest FSDP unit, the root (embeddings and, untied, the
      output projection): ``V·h·b`` once or twice;
    - one chunk of float32 logits and its softmax in the chunked log-probs:
      ``3 · chunk · V · 4``;
    - :data:`STEP_SLACK_BYTES` for what the tensors above leave out.

    An estimate (transformers' kernels and torch's allocator add their own); it is written to be
    above what a step measured on a GPU held (benchmarks/RESULTS.md, "The learner on a GPU")."""
    h, inter = int(config["hidden_size"]), int(config.get("intermediate_size", 4 * int(config["hidden_size"])))
    layers, vocab = int(config["num_hidden_layers"]), int(config["vocab_size"])
    tokens = int(micro_batch_tokens)
    one_layer = tokens * (6 * h + 4 * inter) * compute_bytes
    kept = layers * tokens * h * compute_bytes + one_layer if checkpointing else layers * one_layer
    root = vocab * h * compute_bytes * (1 if config.get("tie_word_embeddings", False) else 2)
    logits = 3 * min(int(logprob_chunk_tokens), tokens) * vocab * 4
    return kept + root + logits + STEP_SLACK_BYTES


STEP_SLACK_BYTES = 3 * 2**28
"""0.75 GiB a step holds beyond the tensors :func:`step_working_set` counts: CUDA libraries'
workspaces, the caching allocator's rounding, transformers' temporaries. An allowance read off
the H100's steady-state peaks (step 2, AdamW's moments on the GPU during the backward pass;
benchmarks/RESULTS.md, "The second H100 run"), which exceeded the counted tensors by less than
it; ``tests/test_placement_plan.py`` holds the plan above those records."""


IPC_BUFFER_BYTES = 2**30
"""The CUDA IPC staging buffer per learner rank (vLLM's packed mode), at least, bytes: parameters
travel in chunks this large, so a handover holds one chunk, not a second copy of the model; a
larger parameter (a 7B model's embedding in bfloat16 is 1.09 GB) enlarges it to its size."""


def memory_plan(recipe: Recipe, gpu_memory_gib: float) -> MemoryPlan | None:
    """GPU memory of one colocated device for ``recipe`` (None when the model's size is unknown
    here: no local config and not a known hub id). Full fine-tuning: float32 master weights,
    gradients and two AdamW moments, 16 bytes a parameter, sharded over ``learner.num_ranks``;
    LoRA: the frozen base in ``model.dtype`` plus a small adapter."""
    config = _read_config(recipe.model.path)
    shapes = config if config is not None else KNOWN_SHAPES.get(recipe.model.path.lower())
    if config is not None:
        n = model_parameters(config)
    else:
        n = KNOWN_SIZES.get(recipe.model.path.lower())
        if n is None:
            return None
    ranks = recipe.learner.num_ranks
    if recipe.lora is not None:
        base = 2 if recipe.model.dtype in ("bfloat16", "float16", "auto") else 4
        learner = n * base / ranks + 0.02 * n * 16 / ranks
    else:
        learner = n * 16 / ranks
    wire = 4 if recipe.model.dtype == "float32" else 2  # "auto" serves bfloat16 on GPUs
    handover = 0.0
    if recipe.generator.weight_sync == "ipc":
        largest = int(shapes["vocab_size"]) * int(shapes["hidden_size"]) * wire if shapes else 0  # the embedding
        handover = max(IPC_BUFFER_BYTES, largest) / 2**30
    activations = None
    if shapes is not None:
        activations = step_working_set(
            shapes, micro_batch_tokens=recipe.learner.micro_batch_tokens, logprob_chunk_tokens=recipe.learner.logprob_chunk_tokens,
            checkpointing=recipe.learner.activation_checkpointing, compute_bytes=wire,
        ) / 2**30
    return MemoryPlan(
        parameters=n, learner=learner / 2**30, generator=recipe.generator.gpu_memory_utilization * gpu_memory_gib,
        device=gpu_memory_gib, handover=handover, weights=n * wire / 2**30, offloaded=recipe.learner.offload_states,
        activations=activations,
    )



def apply_placement(recipe: Recipe, plan: PlacementPlan) -> Recipe:
    """``recipe`` with ``placement.mode`` resolved to ``plan.mode`` and, colocated on CPUs, the
    threads the plan gives each phase (the learner's, the critic's and the SFT stage's torch
    threads, vLLM's OpenMP binding). What the run then reads is what it does."""
    update: dict[str, Any] = {"placement": recipe.placement.model_copy(update={"mode": plan.mode})}
    if plan.colocated and plan.torch_threads is not None:
        update["learner"] = recipe.learner.model_copy(update={"torch_threads": plan.torch_threads})
        if "torch_threads" not in recipe.sft.model_fields_set:
            update["sft"] = recipe.sft.model_copy(update={"torch_threads": plan.torch_threads})
        if recipe.algo.advantage == "gae" and plan.critic_threads is not None:
            update["critic"] = recipe.critic_settings.model_copy(update={"torch_threads": plan.critic_threads})
        if plan.cpu_threads_bind is not None:
            update["generator"] = recipe.generator.model_copy(update={"cpu_threads_bind": plan.cpu_threads_bind})
    return recipe.model_copy(update=update)
