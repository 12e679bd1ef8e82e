"""Tiny Qwen2 models built from scratch, saved as ordinary Hugging Face folders.

No model can be downloaded in tests, so the project builds its own: a byte-level BPE tokenizer
trained on the given texts and a randomly initialised ``Qwen2ForCausalLM``. The folder loads
unchanged with ``transformers`` (``AutoTokenizer``/``AutoModelForCausalLM``) and with vLLM.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import GenerationConfig, PreTrainedTokenizerBase, Qwen2Config, Qwen2ForCausalLM

from agentrl.errors import ModelError
from agentrl.models.tokenizer import IM_END, PAD_TOKEN, train_tokenizer

SUPPORTED_HEAD_DIMS: tuple[int, ...] = (64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""``hidden_size // num_heads`` values allowed: those vLLM 0.32's CPU attention lists, from 64 up
(64 is the one verified here; 16 fails with "Unsupported CPU attention configuration")."""


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of a tiny Qwen2 model. The defaults give about 0.37 M parameters (float32)."""

    vocab_size: int = 400
    """Largest tokenizer to train (``len(tokenizer)``; fewer when the texts support fewer merges).
    The model's vocabulary is exactly ``len(tokenizer)``, so it can only emit real tokens."""
    hidden_size: int = 128
    """Width of the residual stream."""
    num_layers: int = 2
    """Number of transformer blocks."""
    num_heads: int = 2
    """Attention (query) heads; ``hidden_size / num_heads`` must be 64 (or another head size
    vLLM's CPU attention supports, see :data:`SUPPORTED_HEAD_DIMS`)."""
    num_kv_heads: int = 1
    """Key/value heads (grouped-query attention); must divide ``num_heads``."""
    intermediate_size: int = 256
    """Width of the MLP's hidden layer."""
    max_position_embeddings: int = 4096
    """Longest sequence (prompt + completion, in tokens) the model is configured for."""
    tie_word_embeddings: bool = False
    """Share the input embedding with the output projection."""
    seed: int = 0
    """Seed of the random initialisation (``torch.manual_seed``)."""

    def validate(self) -> None:
        """Raise :class:`ModelError` if the shape is inconsistent or vLLM could not run it."""
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                     "intermediate_size", "max_position_embeddings"):
            if getattr(self, name) <= 0:
                raise ModelError(f"TinyModelSpec.{name} must be positive, got {getattr(self, name)}")
        if self.hidden_size % self.num_heads:
            raise ModelError(
                f"TinyModelSpec: hidden_size={self.hidden_size} is not divisible by "
                f"num_heads={self.num_heads}"
            )
        head_dim = self.hidden_size // self.num_heads
        if head_dim not in SUPPORTED_HEAD_DIMS:
            raise ModelError(
                f"TinyModelSpec: head_dim = hidden_size/num_heads = {self.hidden_size}/"
                f"{self.num_heads} = {head_dim}, but vLLM's CPU attention needs one of "
                f"{SUPPORTED_HEAD_DIMS} (use 64, e.g. hidden_size=128 with num_heads=2)"
            )
        if self.num_heads % self.num_kv_heads:
            raise ModelError(
                f"TinyModelSpec: num_heads={self.num_heads} is not a multiple of "
                f"num_kv_heads={self.num_kv_heads}"
            )


def _qwen2_config(spec: TinyModelSpec, tok: PreTrainedTokenizerBase) -> Qwen2Config:
    eos_id = tok.convert_tokens_to_ids(IM_END)
    pad_id = tok.convert_tokens_to_ids(PAD_TOKEN)
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.hidden_size // spec.num_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=spec.tie_word_embeddings,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    config.dtype = torch.float32
    return config


def _save_tokenizer(tok: PreTrainedTokenizerBase, out: Path, model_max_length: int) -> None:
    """``save_pretrained``, then write ``tokenizer_config.json`` in the portable form that both
    transformers 4.x and 5.x read (class ``PreTrainedTokenizerFast``,
    ``additional_special_tokens``)."""
    tok.model_max_length = model_max_length
    tok.save_pretrained(out)
    path = out / "tokenizer_config.json"
    cfg = json.loads(path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    extra = cfg.pop("extra_special_tokens", None)
    if isinstance(extra, list):
        cfg["additional_special_tokens"] = extra
    elif extra:
        cfg["extra_special_tokens"] = extra
    path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


def build_tiny_model(
    out_dir: str | Path,
    texts: Iterable[str],
    spec: TinyModelSpec = TinyModelSpec(),
    *,
    overwrite: bool = False,
) -> Path:
    """Train a tokenizer on ``texts``, build a random Qwen2 model, save both into ``out_dir``.

    The folder holds ``config.json`` (float32), ``model.safetensors``, ``generation_config.json``
    (``eos_token_id`` = ``<|im_end|>``), ``tokenizer.json``, ``tokenizer_config.json`` and
    ``chat_template.jinja``. It is written into a sibling temporary folder and renamed into place,
    so ``out_dir`` is either absent or complete. An existing non-empty ``out_dir`` raises
    :class:`ModelError` unless ``overwrite`` is true. Returns ``out_dir`` as an absolute path.
    """
    spec.validate()
    out = Path(out_dir).expanduser().absolute()
    if out.exists() and not out.is_dir():
        raise ModelError(f"cannot build a tiny model at {str(out)!r}: it exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ModelError(
            f"cannot build a tiny model at {str(out)!r}: the folder is not empty "
            "(pass overwrite=True to replace it)"
        )
    out.parent.mkdir(parents=True, exist_ok=True)

    tok = train_tokenizer(texts, vocab_size=spec.vocab_size)
    config = _qwen2_config(spec, tok)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = Qwen2ForCausalLM(config).to(torch.float32).eval()
    generation = GenerationConfig(
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        bos_token_id=None,
    )

    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.building-", dir=out.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        generation.save_pretrained(tmp)
        _save_tokenizer(tok, tmp, spec.max_position_embeddings)
        os.chmod(tmp, 0o755)
        if out.is_dir() and any(out.iterdir()):
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            os.replace(out, old / "model")
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)  # replaces an empty folder atomically
    except OSError as e:
        raise ModelError(f"cannot write the tiny model to {str(out)!r}: {e}") from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
