"""The one way agentrl loads tokenizers and causal LMs: any Hugging Face folder or hub id.

Every failure (a missing folder, a hub id that cannot be reached, a broken config) becomes a
:class:`~agentrl.errors.ModelError` that names the path or id and says what went wrong; the
library's exception is kept as ``__cause__``. Environment variables are read, never set: with
``HF_HUB_OFFLINE=1`` hub ids load from the local cache only.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlparse

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from agentrl.errors import ModelError

T = TypeVar("T")

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")
_PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")


def looks_like_local_path(s: str) -> bool:
    """True if ``s`` names a local folder rather than a hub id (``org/name`` or ``name``).

    It does when it exists on disk, starts with ``/``, ``.`` or ``~``, holds a backslash, or has
    more than one ``/``.
    """
    if not s:
        return False
    if os.path.exists(os.path.expanduser(s)):
        return True
    return s.startswith(("/", ".", "~")) or "\\" in s or s.count("/") > 1


def _local_folder(name_or_path: str, what: str) -> Path:
    path = Path(name_or_path).expanduser()
    if not path.exists():
        raise ModelError(f"cannot load the {what} from {name_or_path!r}: the path does not exist")
    if not path.is_dir():
        raise ModelError(
            f"cannot load the {what} from {name_or_path!r}: it is not a folder "
            "(expected a Hugging Face model folder)"
        )
    return path


def _describe(e: BaseException) -> str:
    text = " ".join(str(e).split())
    if len(text) > 400:
        text = text[:400] + "..."
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the hub's host accepts a TCP connection (assumed so behind a proxy)."""
    if any(os.environ.get(v) for v in _PROXY_VARS):
        return True
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    url = urlparse(endpoint)
    host = url.hostname or "huggingface.co"
    port = url.port or (80 if url.scheme == "http" else 443)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _load(name_or_path: str, what: str, fn: Callable[..., T], **kwargs: object) -> T:
    if looks_like_local_path(name_or_path):
        path = _local_folder(name_or_path, what)
        if what == "model" and not (path / "config.json").is_file():
            raise ModelError(f"cannot load the model from {name_or_path!r}: it has no config.json")
        if what == "tokenizer" and not any((path / f).is_file() for f in _TOKENIZER_FILES):
            raise ModelError(
                f"cannot load the tokenizer from {name_or_path!r}: it holds none of "
                f"{', '.join(_TOKENIZER_FILES)}"
            )
        try:
            return fn(str(path), **kwargs)
        except Exception as e:
            raise ModelError(f"cannot load the {what} from {name_or_path!r}: {_describe(e)}") from e

    # A hub id. Offline (no connection to the hub), go straight to the local cache instead of
    # letting huggingface_hub retry for most of a minute.
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    reachable = not offline and hub_reachable()
    try:
        return fn(name_or_path, **kwargs) if reachable else fn(
            name_or_path, local_files_only=True, **kwargs
        )
    except Exception as e:
        if not reachable and isinstance(e, OSError):
            why = "HF_HUB_OFFLINE is set" if offline else "the Hugging Face Hub could not be reached"
            raise ModelError(
                f"cannot load the {what} {name_or_path!r}: it is not a local folder, {why} and it "
                "is not in the local Hugging Face cache; download it (`hf download "
                f"{name_or_path}`) or point at a local folder ({_describe(e)})"
            ) from e
        raise ModelError(
            f"cannot load the {what} {name_or_path!r} from the Hugging Face Hub: {_describe(e)}"
        ) from e


def load_tokenizer(name_or_path: str) -> PreTrainedTokenizerBase:
    """Load the tokenizer (with its chat template) of a local folder or hub id.

    Raises :class:`ModelError` naming ``name_or_path`` if it cannot be found or loaded.
    """
    return _load(name_or_path, "tokenizer", AutoTokenizer.from_pretrained)


def attention_kwargs(attn_implementation: str | None) -> dict[str, str]:
    """``from_pretrained``/``_from_config`` keyword arguments that choose ``attn_implementation``
    (None: none, transformers' default)."""
    return {"attn_implementation": attn_implementation} if attn_implementation is not None else {}


def load_causal_lm(
    name_or_path: str, *, dtype: torch.dtype = torch.float32, attn_implementation: str | None = None
) -> PreTrainedModel:
    """Load a causal LM from a local folder or hub id, with parameters in ``dtype``, in eval mode;
    ``attn_implementation``: transformers' (None: its default).

    Raises :class:`ModelError` naming ``name_or_path`` if it cannot be found or loaded.
    """
    model = _load(name_or_path, "model", AutoModelForCausalLM.from_pretrained, dtype=dtype, **attention_kwargs(attn_implementation))
    return model.eval()
