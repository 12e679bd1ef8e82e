"""Models and tokenizers: build tiny Qwen2 models from scratch, import GGUF models as Hugging Face
folders, and load any Hugging Face model."""

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
