"""Training checkpoints (for resume) and their Hugging Face export.

A checkpoint is a folder written by every learner rank together
(:meth:`agentrl.engine.training.learner.Learner.save_checkpoint`)::

    CHECKPOINT/
      .metadata, __<rank>_<i>.distcp   torch.distributed.checkpoint: sharded model ("model.*") and
                                       AdamW state ("optim.*"), re-shardable to another rank count
      trainer_state.json               step, LR-scheduler state, world size, settings (rank 0)
      rng/rank<r>.pt                   each rank's torch / CUDA / Python / NumPy RNG state
      hf/                              config.json, generation_config.json (+ tokenizer files): what an export needs

The folder appears atomically: ranks write into a hidden sibling that rank 0 renames into place.
All ranks must see the same filesystem (one machine, or a shared mount on a cluster).

:func:`export_checkpoint` turns any checkpoint into a Hugging Face model folder in one process,
without a process group and without instantiating the model (shapes come from the checkpoint's
metadata). The CLI runs it as ``agentrl export CHECKPOINT_DIR OUT_DIR``.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import threading
import warnings
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch

from agentrl.errors import LearnerError

__all__ = [
    "CHECKPOINT_FORMAT",
    "export_checkpoint",
    "read_trainer_state",
    "write_trainer_state",
    "save_rng_state",
    "load_rng_state",
    "save_sharded_state",
    "saves_optimizer_state",
    "start_sharded_save",
    "load_sharded_state",
    "open_collective_folder",
    "close_collective_folder",
    "put_in_place_when_written",
]

CHECKPOINT_FORMAT = 1
"""Version of the folder layout above (``trainer_state.json["format"]``)."""

MODEL_PREFIX = "model."
"""Key prefix of the model's tensors inside the distributed checkpoint."""


def write_trainer_state(folder: Path, state: dict[str, Any]) -> None:
    """Write ``trainer_state.json`` (plain JSON values only)."""
    (Path(folder) / "trainer_state.json").write_text(json.dumps({"format": CHECKPOINT_FORMAT, **state}, indent=2))


def read_trainer_state(folder: str | Path) -> dict[str, Any]:
    """Read ``trainer_state.json``; raises :class:`LearnerError` when the folder is not a checkpoint."""
    path = Path(folder) / "trainer_state.json"
    if not path.is_file():
        raise LearnerError(f"{folder}: not an agentrl checkpoint (no trainer_state.json)")
    state = json.loads(path.read_text())
    if state.get("format") != CHECKPOINT_FORMAT:
        raise LearnerError(f"{folder}: checkpoint format {state.get('format')!r}; this agentrl reads {CHECKPOINT_FORMAT}")
    return state


def save_rng_state(path: Path) -> None:
    """Save this process's torch, CUDA, Python and NumPy RNG states to ``path``."""
    import numpy as np

    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "python": random.getstate(),
        "numpy": (name, torch.from_numpy(keys.astype("int64")), int(pos), int(has_gauss), float(cached)),
    }
    torch.save(state, path)


def load_rng_state(path: Path) -> None:
    """Restore the RNG states written by :func:`save_rng_state`."""
    import numpy as np

    state = torch.load(path, weights_only=True)
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    random.setstate(state["python"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype("uint32"), pos, has_gauss, cached))


def open_collective_folder(final: Path, rank: int, subdirs: tuple[str, ...] = ()) -> Path:
    """The hidden sibling of ``final`` that every rank of the default process group writes into
    (collective): rank 0 makes it afresh (with ``subdirs``), a barrier, and every rank gets its
    path. :func:`close_collective_folder` puts it in place."""
    import torch.distributed as dist

    tmp = final.with_name(f".{final.name}.tmp")
    if rank == 0:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        for sub in subdirs:
            (tmp / sub).mkdir()
    dist.barrier()
    return tmp


def close_collective_folder(tmp: Path, final: Path, rank: int, written_already: bool = False) -> None:
    """Rename ``tmp`` (from :func:`open_collective_folder`) to ``final`` once every rank wrote its
    part (collective: barriers before and after rank 0's rename, which replaces what was there).
    With ``written_already``, a ``tmp`` that is gone was put in place by
    :func:`put_in_place_when_written` (and may have moved on since with the folder around it,
    a run checkpoint being put in place): only one still there is renamed."""
    import torch.distributed as dist

    dist.barrier()
    if rank == 0 and (tmp.exists() or not written_already):
        _replace(tmp, final)
    dist.barrier()


def _replace(tmp: Path, final: Path) -> None:
    """``final`` becomes ``tmp`` (what was at ``final`` is removed)."""
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)


def put_in_place_when_written(future: Future[Any], tmp: Path, final: Path) -> threading.Event:
    """Rename ``tmp`` to ``final`` as soon as ``future`` (the coordinating rank's background write,
    :func:`start_sharded_save`) succeeds: its end means every rank's share is written. Called on
    rank 0 only, after every rank's own files are in ``tmp``. Returns an event set once the
    attempt is over (wait for it before touching either folder). A failed write or rename leaves
    ``tmp`` hidden (:func:`close_collective_folder` tries the rename again and raises)."""
    over = threading.Event()

    def done(f: Future[Any]) -> None:
        try:
            if not f.cancelled() and f.exception() is None:
                with contextlib.suppress(OSError):
                    _replace(tmp, final)
        finally:
            over.set()

    future.add_done_callback(done)
    return over


def saves_optimizer_state(optimizer: torch.optim.Optimizer) -> bool:
    """Whether a checkpoint of ``optimizer`` now holds its state: only once it has some (before
    the first update ``get_state_dict`` would give AdamW an empty state, one zero step, and
    change the run); the model is then saved alone."""
    return bool(optimizer.state)


def _sharded_state(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], bool]:
    """What :func:`save_sharded_state` saves: ``{"model": ..., "optim": ...}`` (the optimizer's
    part per :func:`saves_optimizer_state`), and whether the optimizer's part is there."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if saves_optimizer_state(optimizer):
        model_sd, optim_sd = get_state_dict(module, optimizer)
        return {"model": model_sd, "optim": optim_sd}, True
    return {"model": get_model_state_dict(module)}, False


def save_sharded_state(module: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> bool:
    """Save ``module``'s (sharded) weights under ``model.*`` and ``optimizer``'s state under
    ``optim.*`` into ``folder`` with ``torch.distributed.checkpoint`` (a collective). Before the
    first update the model is saved alone. Returns whether the optimizer state was saved."""
    import torch.distributed.checkpoint as dcp

    state, has_optim = _sharded_state(module, optimizer)
    dcp.save(state, checkpoint_id=str(folder))
    return has_optim


def start_sharded_save(
    module: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: Path, group: Any
) -> tuple[Future[Any], bool]:
    """:func:`save_sharded_state` in the background: the state is copied to CPU memory now (a
    snapshot: training may go on and change the weights), and written to ``folder`` by a thread
    that coordinates the ranks over ``group`` (a CPU process group of its own, so that its
    collectives never interleave with training's on the default group). Returns the write's
    future (its ``result()`` raises what the write raised) and whether the optimizer state is in it."""
    import torch.distributed.checkpoint as dcp

    state, has_optim = _sharded_state(module, optimizer)
    future = dcp.async_save(state, checkpoint_id=str(folder), process_group=group)
    return future, has_optim


def load_sharded_state(module: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: Path, has_optim: bool) -> None:
    """Restore what :func:`save_sharded_state` wrote (a collective; re-shards to this group's
    rank count). ``has_optim``: its return value; without optimizer state AdamW starts empty."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_state_dict,
        set_model_state_dict,
        set_state_dict,
    )

    if has_optim:
        model_sd, optim_sd = get_state_dict(module, optimizer)
        dcp.load({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(folder))
        set_state_dict(module, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)
    else:
        model_sd = get_model_state_dict(module)
        dcp.load({"model": model_sd}, checkpoint_id=str(folder))
        set_model_state_dict(module, model_sd)
        optimizer.state.clear()


def _model_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """Load the model's tensors of a distributed checkpoint into one process (CPU, unsharded)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    reader = dcp.FileSystemReader(str(folder))
    meta = reader.read_metadata().state_dict_metadata
    tensors = {
        key: torch.empty(tuple(md.size), dtype=md.properties.dtype)
        for key, md in meta.items()
        if key.startswith(MODEL_PREFIX) and isinstance(md, TensorStorageMetadata)
    }
    if not tensors:
        raise LearnerError(f"{folder}: the checkpoint holds no model tensors")
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(tensors, storage_reader=reader, no_dist=True)
    return {key[len(MODEL_PREFIX):]: t for key, t in tensors.items()}


def export_checkpoint(checkpoint_dir: str | Path, out_dir: str | Path, merge: bool = False) -> Path:
    """Write the model of a training checkpoint as a Hugging Face folder at ``out_dir``.

    A LoRA checkpoint is written as its adapter alone (a peft folder: peft and vLLM load it on
    top of the base model the checkpoint names), or with ``merge`` as the base model with the
    adapter merged in (a plain Hugging Face folder).

    The folder (``model.safetensors``, ``config.json`` and the tokenizer when the checkpoint
    holds one) loads with transformers and vLLM, like a published weight version; it is
    written atomically. Runs in one process, whatever the number of ranks that wrote the
    checkpoint, in the run's training dtype (``model.dtype``; the float32 master weights of a
    bfloat16 run are exported as bfloat16). ``checkpoint_dir`` is a learner checkpoint or a run checkpoint folder holding one
    in ``learner/``. Raises :class:`LearnerError` if it is neither.
    """
    from transformers import AutoConfig, AutoTokenizer

    from agentrl.models.hf_folder import write_hf_folder

    folder = Path(checkpoint_dir)
    if not (folder / "trainer_state.json").is_file() and (folder / "learner" / "trainer_state.json").is_file():
        folder = folder / "learner"  # a run's checkpoint (checkpoints/step_N) holds the learner's in learner/
    trainer_state = read_trainer_state(folder)
    hf = folder / "hf"
    try:
        config = AutoConfig.from_pretrained(hf)
    except Exception as exc:
        raise LearnerError(f"{folder}: cannot read the model config in hf/: {exc}") from exc
    generation_config = None
    if (hf / "generation_config.json").is_file():
        from transformers import GenerationConfig

        try:
            generation_config = GenerationConfig.from_pretrained(hf)
        except Exception as exc:
            raise LearnerError(f"{folder}: cannot read the generation config in hf/: {exc}") from exc
    tokenizer = None
    if (hf / "tokenizer_config.json").is_file() or (hf / "tokenizer.json").is_file():
        try:
            tokenizer = AutoTokenizer.from_pretrained(hf)
        except Exception as exc:
            raise LearnerError(f"{folder}: cannot read the tokenizer in hf/: {exc}") from exc
    try:
        tensors = _model_tensors(folder)
    except LearnerError:
        raise
    except Exception as exc:
        raise LearnerError(f"{folder}: cannot read the distributed checkpoint: {exc}") from exc
    dtype = getattr(torch, trainer_state["dtype"]) if "dtype" in trainer_state else None  # older checkpoints: as stored
    if trainer_state.get("lora"):
        from agentrl.engine.training.lora import (
            LoraSettings,
            adapter_tensors,
            merge_lora,
            write_adapter_folder,
        )

        lora = LoraSettings(**trainer_state["lora"])
        if not merge:
            adapter = {k: (t.to(dtype) if dtype is not None and t.is_floating_point() else t) for k, t in adapter_tensors(tensors).items()}
            return write_adapter_folder(adapter, lora, trainer_state["model"], Path(out_dir))
        tensors = merge_lora(tensors, lora.scaling)
    return write_hf_folder(tensors, config, Path(out_dir), tokenizer, generation_config, dtype)
