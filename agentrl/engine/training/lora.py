"""LoRA adapters: wrapping a model with peft, the adapter folder format, and merging.

The learner trains only the adapter (:func:`apply_lora`). What leaves it is the adapter alone, as
a peft folder (``adapter_config.json`` + ``adapter_model.safetensors``) that peft and vLLM load
(:func:`write_adapter_folder`); a merged Hugging Face model (:func:`merge_lora`) is written for
the final model and ``agentrl export --merge``.

Names. Inside the learner the LoRA model is peft's inner model, whose parameter names look like
``model.layers.0.self_attn.q_proj.base_layer.weight`` (the frozen base),
``...q_proj.lora_A.default.weight`` and ``...q_proj.lora_B.default.weight``. The adapter file
uses peft's saved names (``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from agentrl.errors import ConfigError

__all__ = [
    "ADAPTER_NAME",
    "VLLM_LORA_RANKS",
    "LoraSettings",
    "adapter_tensors",
    "apply_lora",
    "is_adapter_folder",
    "is_adapter_key",
    "merge_lora",
    "read_adapter_settings",
    "vllm_max_lora_rank",
    "write_adapter_folder",
]

ADAPTER_NAME = "default"
"""peft's name of the one adapter the learner trains."""

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM accepts for ``max_lora_rank``."""


@dataclass(frozen=True)
class LoraSettings:
    """An adapter's shape (the recipe's ``[lora]``)."""

    rank: int
    """``r``: the rank of each update ``B @ A``."""
    alpha: float = 16.0
    """Scale: the update is ``alpha / rank * B @ A``."""
    dropout: float = 0.0
    """Dropout on the adapter's input during training."""
    target_modules: list[str] | str = "all-linear"
    """Module names (suffixes, as peft matches them) that get an adapter; ``"all-linear"``: every
    linear layer but the output projection."""
    modules_to_save: list[str] = field(default_factory=list)
    """Modules trained in full and saved beside the adapter."""

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    def peft_config(self, base_model: str | None = None) -> Any:
        """The peft ``LoraConfig``."""
        from peft import LoraConfig

        return LoraConfig(
            r=self.rank, lora_alpha=self.alpha, lora_dropout=self.dropout, target_modules=self.target_modules,
            modules_to_save=list(self.modules_to_save) or None, bias="none", task_type="CAUSAL_LM",
            base_model_name_or_path=base_model,
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def vllm_max_lora_rank(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds ``rank``."""
    for r in VLLM_LORA_RANKS:
        if r >= rank:
            return r
    raise ConfigError(f"lora.rank: vLLM serves adapters of rank at most {VLLM_LORA_RANKS[-1]}, got {rank}")


def apply_lora(lm: torch.nn.Module, settings: LoraSettings, model_name: str = "the model") -> Any:
    """Wrap ``lm`` with a fresh adapter (``B = 0``: the wrapped model computes what ``lm`` did);
    only the adapter (and ``modules_to_save``) stays trainable. Returns the peft model; its
    ``base_model.model`` is ``lm`` with the adapter layers inside. A target module that matches
    nothing in ``lm`` is a ConfigError naming the key and the model's module names."""
    from peft import get_peft_model

    names = sorted({n.rsplit(".", 1)[-1] for n, m in lm.named_modules() if isinstance(m, torch.nn.Linear)})
    wanted = [settings.target_modules] if isinstance(settings.target_modules, str) else list(settings.target_modules)
    if wanted != ["all-linear"]:
        missing = [t for t in wanted if not any(n == t or n.endswith("." + t) or n.rsplit(".", 1)[-1] == t for n, _ in lm.named_modules())]
        if missing:
            raise ConfigError(f"lora.target_modules: {missing} match no module of {model_name}; its linear layers are {names}")
    present = {n.rsplit(".", 1)[-1] for n, _ in lm.named_modules()}
    absent = [m for m in settings.modules_to_save if m not in present]
    if absent:
        raise ConfigError(f"lora.modules_to_save: {absent} match no module of {model_name}")
    try:
        return get_peft_model(lm, settings.peft_config(model_name), adapter_name=ADAPTER_NAME)
    except ValueError as exc:  # peft's own check of the targets
        raise ConfigError(f"lora.target_modules: {exc}") from exc


def is_adapter_key(name: str) -> bool:
    """Whether a LoRA model's state key (inner-model name) is the adapter's (trained) tensor."""
    return ".lora_A." in name or ".lora_B." in name or ".modules_to_save." in name


def adapter_tensors(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapter's tensors of a LoRA model's state (inner-model names), under the names of
    peft's adapter file."""
    out = {}
    for name, t in state.items():
        if not is_adapter_key(name):
            continue
        key = "base_model.model." + name.replace(f".{ADAPTER_NAME}.", ".")
        out[key] = t.contiguous()
    return out


def merge_lora(state: dict[str, torch.Tensor], scaling: float) -> dict[str, torch.Tensor]:
    """A plain Hugging Face state dict from a LoRA model's state (inner-model names): each
    adapted weight becomes ``W + scaling * B @ A`` (in float32, cast back), fully trained
    ``modules_to_save`` replace their originals, and the adapter's own tensors are dropped."""
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        if is_adapter_key(name) or ".original_module." in name:
            continue
        if ".base_layer." in name:
            prefix, _, leaf = name.partition(".base_layer.")
            if leaf == "weight" and f"{prefix}.lora_A.{ADAPTER_NAME}.weight" in state:
                a = state[f"{prefix}.lora_A.{ADAPTER_NAME}.weight"].float()
                b = state[f"{prefix}.lora_B.{ADAPTER_NAME}.weight"].float()
                t = (t.float() + scaling * (b @ a)).to(t.dtype)
            out[f"{prefix}.{leaf}"] = t
        else:
            out[name] = t
    for name, t in state.items():
        if f".modules_to_save.{ADAPTER_NAME}." in name:
            out[name.replace(f".modules_to_save.{ADAPTER_NAME}.", ".")] = t
    return out


def write_adapter_folder(tensors: dict[str, torch.Tensor], settings: LoraSettings, base_model: str, out_dir: str | os.PathLike[str]) -> Path:
    """Write a peft adapter folder (``adapter_config.json``, ``adapter_model.safetensors``)
    atomically at ``out_dir`` (an existing one is replaced); ``tensors`` as
    :func:`adapter_tensors` names them."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    tmp = out.with_name(f".{out.name}.tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(tmp / "adapter_model.safetensors"))
    settings.peft_config(base_model).save_pretrained(str(tmp))
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out


def is_adapter_folder(folder: str | os.PathLike[str]) -> bool:
    """Whether ``folder`` holds a peft adapter (not a whole model)."""
    return (Path(folder) / "adapter_config.json").is_file()


def read_adapter_settings(folder: str | os.PathLike[str]) -> LoraSettings:
    """The settings an adapter folder was written with."""
    cfg = json.loads((Path(folder) / "adapter_config.json").read_text())
    return LoraSettings(
        rank=int(cfg["r"]), alpha=float(cfg["lora_alpha"]), dropout=float(cfg.get("lora_dropout", 0.0)),
        target_modules=cfg["target_modules"], modules_to_save=list(cfg.get("modules_to_save") or []),
    )
