"""Models and tokenizers: build tiny Qwen2 models from scratch, import GGUF models as Hugging Face
folders, and load any Hugging Face model."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentrl.models.importing import PACKAGED_MODELS, import_model
    from agentrl.models.loading import load_causal_lm, load_tokenizer, looks_like_local_path
    from agentrl.models.tiny import SUPPORTED_HEAD_DIMS, TinyModelSpec, build_tiny_model
    from agentrl.models.tokenizer import (
        CHAT_TEMPLATE,
        IM_END,
        IM_START,
        PAD_TOKEN,
        SPECIAL_TOKENS,
        TOOL_TOKENS,
        train_tokenizer,
    )

_HOMES = {
    "PACKAGED_MODELS": "importing", "import_model": "importing",
    "load_causal_lm": "loading", "load_tokenizer": "loading", "looks_like_local_path": "loading",
    "SUPPORTED_HEAD_DIMS": "tiny", "TinyModelSpec": "tiny", "build_tiny_model": "tiny",
    "CHAT_TEMPLATE": "tokenizer", "IM_END": "tokenizer", "IM_START": "tokenizer", "PAD_TOKEN": "tokenizer",
    "SPECIAL_TOKENS": "tokenizer", "TOOL_TOKENS": "tokenizer", "train_tokenizer": "tokenizer",
}
"""Where each name of ``__all__`` lives. They are imported on first use (PEP 562): importing one
submodule, e.g. ``agentrl.models.importing`` for ``agentrl model import``, does not import torch
and transformers through ``loading`` (seconds)."""


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'agentrl.models' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"agentrl.models.{home}"), name)
    globals()[name] = value
    return value


__all__ = [
    "CHAT_TEMPLATE",
    "IM_END",
    "IM_START",
    "PACKAGED_MODELS",
    "PAD_TOKEN",
    "SPECIAL_TOKENS",
    "SUPPORTED_HEAD_DIMS",
    "TOOL_TOKENS",
    "TinyModelSpec",
    "build_tiny_model",
    "import_model",
    "load_causal_lm",
    "load_tokenizer",
    "looks_like_local_path",
    "train_tokenizer",
]
