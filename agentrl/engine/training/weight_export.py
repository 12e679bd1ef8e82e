"""The learner's weights leaving the learner: gathered into a full state dict, written as a
folder, or sent to the generators over a weight-transfer group.

- :func:`full_state_dict` gathers an FSDP-sharded Hugging Face model's parameters (a collective
  of the learner's group) onto rank 0, optionally cast as each tensor is gathered;
- :func:`write_export` writes them as a Hugging Face folder, a LoRA adapter folder, or the base
  model with the adapter merged in;
- :class:`WeightSender` is rank ``r``'s side of a weight-transfer group with the generators
  (:mod:`agentrl.engine.generation.weight_transfer`): connect once, then send each new version, bounded by
  a watchdog.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from agentrl.engine.training.lora import LoraSettings, adapter_tensors, is_adapter_key, merge_lora, write_adapter_folder
from agentrl.errors import WeightSyncError
from agentrl.models.hf_folder import write_hf_folder

__all__ = ["WeightSender", "full_state_dict", "write_export"]


def full_state_dict(lm: torch.nn.Module, rank: int, dtype: torch.dtype | None = None, adapter_only: bool = False) -> dict[str, torch.Tensor]:
    """Gather the unsharded parameters of ``lm`` (a collective: call on every rank); CPU tensors
    on rank 0, an empty dict elsewhere. Keys are the Hugging Face model's own; parameters shared
    under two names (tied embeddings) are one tensor under both.

    ``dtype`` casts floating-point tensors before they are gathered: each rank casts its own
    shard on its device, so the gather moves ``dtype`` (a bfloat16 version: half the bytes of the
    float32 master weights) and rank 0 holds the model once, in ``dtype`` (a bfloat16 version of a
    7B model: 15 GB, not 30 GB of float32 and a bfloat16 copy beside it). The tensors are new: they
    never alias the live parameters. ``adapter_only``: the LoRA adapter's tensors alone (names as
    :func:`~agentrl.engine.training.lora.adapter_tensors` reads them)."""
    from torch.distributed.tensor import DTensor

    out: dict[str, torch.Tensor] = {}
    # state_dict() detaches, so tied names give two objects: the parameters say which names
    # are one tensor (the same answer on every rank, as the collectives need)
    param_of = {n: id(p) for n, p in lm.named_parameters(remove_duplicate=False)}
    first_name: dict[int, str] = {}
    for name, value in lm.state_dict().items():
        if adapter_only and not is_adapter_key(name):
            continue
        key = param_of.get(name)
        if key is not None and key in first_name:  # the same parameter under a second name
            if rank == 0:
                out[name] = out[first_name[key]]
            continue
        if key is not None:
            first_name[key] = name
        local = value.to_local() if isinstance(value, DTensor) else value
        if dtype is not None and value.is_floating_point():
            value = value.to(dtype)  # shard by shard (a DTensor casts its local shard), before the gather
        full = value.full_tensor() if isinstance(value, DTensor) else value  # collective for sharded ones
        if rank != 0:
            continue
        t = full.detach().cpu()
        if t.data_ptr() == local.data_ptr():  # one unsharded rank: nothing was copied yet
            t = t.clone()
        out[name] = t
    return out


def write_export(
    sd: dict[str, torch.Tensor],
    out_dir: str,
    *,
    config: Any,
    base_model: str,
    lora: LoraSettings | None = None,
    merged: bool = False,
    tokenizer: Any = None,
    generation_config: Any = None,
    dtype: torch.dtype | None = None,
) -> str:
    """Write the gathered state dict ``sd`` at ``out_dir`` (atomically): with ``lora`` and not
    ``merged``, the adapter alone as a peft folder over ``base_model``; with ``lora`` and
    ``merged``, the base model with the adapter merged in; otherwise the model as a Hugging
    Face folder (``config``, and ``tokenizer``/``generation_config`` when given; ``dtype``: the
    dtype the config states). Returns the folder's path."""
    if lora is not None and not merged:
        return str(write_adapter_folder(adapter_tensors(sd), lora, base_model, out_dir))
    if lora is not None:
        sd = merge_lora(sd, lora.scaling)
    return str(write_hf_folder(sd, config, Path(out_dir), tokenizer, generation_config, dtype))


class WeightSender:
    """One learner rank's side of the weight-transfer group with the generators.

    Rank 0 is the group's sender and drives the generators through a
    :class:`~agentrl.engine.generation.weight_transfer.GeneratorClient`; the other ranks only take part in
    the FSDP gathers. ``device``: the rank's device (a CUDA device is per thread, and the send
    runs in a watchdog's thread)."""

    def __init__(self, rank: int, device: torch.device) -> None:
        self.rank, self.device = rank, device
        self._transfer: Any = None
        """The weight-transfer engine (vLLM's trainer side) once connected; None otherwise."""
        self._client: Any = None
        self._timeout_s = 0.0

    @property
    def connected(self) -> bool:
        """Whether a group is formed and usable (a failed send leaves it unusable)."""
        return self._transfer is not None

    def connect(
        self, backend: str, address: str, port: int, world_size: int, generators: list[Any], timeout_s: float,
        lm: torch.nn.Module, wire_dtype: str,
    ) -> None:
        """Form the group (collective over the learner ranks) at ``address:port`` with
        ``world_size`` = 1 + the generators' vLLM workers; the parameters of ``lm`` travel in
        ``wire_dtype``."""
        from agentrl.engine.generation.weight_transfer import GeneratorClient, model_source, send_watchdog_s, trainer_connect

        # a whole update may take several collective timeouts (one per packed chunk), plus the
        # generators' own calls: the watchdog's bound is generous, but finite; the controller's
        # wait for a send (weight_transfer.send_wait_s) is derived from the same setting, longer
        self._timeout_s = send_watchdog_s(timeout_s)
        self._client = GeneratorClient(generators, timeout_s) if self.rank == 0 else None
        try:
            self._transfer = trainer_connect(
                backend, rank=self.rank, address=address, port=port, world_size=world_size,
                client=self._client, source=model_source(lm, getattr(torch, wire_dtype)), timeout_s=timeout_s,
            )
        except WeightSyncError:
            raise
        except Exception as exc:
            raise WeightSyncError(
                f"rank {self.rank}: forming the {backend} weight-transfer group at {address}:{port} failed: {type(exc).__name__}: {exc}"
            ) from exc

    def send(self, version: int) -> float:
        """Broadcast the current parameters to the generators as ``version`` (collective over
        the learner ranks). Returns the seconds it took."""
        from agentrl.engine.generation.weight_transfer import run_bounded

        if self._transfer is None:
            raise WeightSyncError("no weight-transfer group: call connect_weight_transfer first")
        t0 = time.monotonic()
        if self._client is not None:
            self._client.version = version
        transfer = self._transfer

        def send() -> None:
            if self.device.type == "cuda":  # the device is per thread
                torch.cuda.set_device(self.device)
            transfer.send_weights()

        try:
            # the generators' own calls are bounded by the client; the broadcast (NCCL has no
            # timeout) by this watchdog, which aborts the group when it runs out
            run_bounded(send, self._timeout_s, transfer.shutdown, f"rank {self.rank}: sending version {version}")
        except WeightSyncError:
            self._transfer = None
            raise
        except Exception as exc:
            self._transfer = None  # a failed collective leaves the group unusable
            raise WeightSyncError(f"rank {self.rank}: sending version {version} failed: {type(exc).__name__}: {exc}") from exc
        return time.monotonic() - t0
