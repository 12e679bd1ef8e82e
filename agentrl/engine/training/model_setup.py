"""Building a rank's model: its precision, activation checkpointing, and loading it sharded from
rank 0. The learner and the critic both build their models here.

- :func:`mixed_precision`: the ``fully_shard`` precision policy. ``bfloat16`` means mixed
  precision on a CUDA device and on the CPU alike (float32 master weights and optimizer state,
  compute in bfloat16, gradients reduced in float32); ``float16`` (which would need loss
  scaling) and ``float32`` train in float32 throughout.
- :func:`checkpoint_activations`: recompute each decoder layer's activations in the backward
  pass (transformers' gradient checkpointing, non-reentrant).
- :func:`load_sharded`: the model, sharded with FSDP2, without any rank holding a whole float32
  copy on its device.

  With one rank the model is loaded, moved to the device and sharded (one unit).

  With more ranks it is **initialised on the meta device and broadcast from rank 0**:

  1. rank 0 loads the checkpoint on the CPU in the checkpoint's own dtype (memory-mapped by
     transformers when nothing needs converting: page cache, not a private copy) and builds
     the module from it; the others load nothing;
  2. rank 0 sends the model's class, config and generation config to every rank (or the error
     that stopped it, which every rank then raises);
  3. every rank builds the same module on the meta device (no memory), in the dtypes it will
     train in, and shards it; ``to_empty`` then gives each rank storage for its shards only;
  4. the full state dict is broadcast from rank 0 one tensor at a time
     (``set_model_state_dict(..., StateDictOptions(full_state_dict=True,
     broadcast_from_rank0=True))``): each rank keeps its slice of each tensor, cast to the
     shard's dtype; the buffers outside the state dict (rotary frequencies) are broadcast too.

  Each rank's device then holds its shards plus one tensor in flight; rank 0's CPU holds the
  checkpoint as loaded.

**Dtypes.** Parameters that are trained are float32 (master weights); frozen ones (a LoRA base, a
KL reference model) stay in the model's dtype: ``bfloat16`` under mixed precision, float32
otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from agentrl.errors import LearnerError

__all__ = ["checkpoint_activations", "frozen_dtype", "load_sharded", "mixed_precision"]


def mixed_precision(dtype: torch.dtype, device: torch.device) -> Any:
    """The ``MixedPrecisionPolicy`` of a model trained with the recipe's ``dtype`` on
    ``device`` (a CUDA device or the CPU alike): compute in ``bfloat16``, reduce in float32 when
    ``dtype`` is bfloat16; None (float32 throughout) otherwise."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    del device  # the same policy on every device: a CPU's bfloat16 units are used as a GPU's
    if dtype == torch.bfloat16:
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return None


def frozen_dtype(mp_policy: Any) -> torch.dtype:
    """The dtype frozen parameters are kept in: the compute dtype under mixed precision
    (``mp_policy`` not None), float32 otherwise."""
    return mp_policy.param_dtype if mp_policy is not None else torch.float32


def checkpoint_activations(model: Any) -> None:
    """Turn on transformers' non-reentrant gradient checkpointing of ``model`` (a
    ``PreTrainedModel``: a causal LM or its decoder trunk): each decoder layer's activations
    are recomputed in the backward pass instead of kept."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def _train_in_float32(module: torch.nn.Module) -> None:
    """Make every trainable parameter of ``module`` float32 (master weights)."""
    for p in module.parameters():
        if p.requires_grad and p.dtype != torch.float32:
            p.data = p.data.float()


def load_sharded(
    name: str,
    *,
    rank: int,
    world_size: int,
    device: torch.device,
    dtype: torch.dtype,
    make: Callable[[Any], torch.nn.Module],
    shard: Callable[[torch.nn.Module], None],
    check: Callable[[torch.nn.Module], None] | None = None,
    role: str = "rank",
    attn_implementation: str | None = None,
) -> torch.nn.Module:
    """The module ``make(lm)`` of the causal LM ``name`` (a folder or hub id), on ``device``,
    sharded by ``shard`` (collective: call on every rank of the group).

    ``dtype``: the dtype of the LM's parameters (frozen ones stay in it; trainable ones become
    float32). ``make``: turns a loaded LM into the module to shard (wraps it, adds adapters or
    heads, sets ``requires_grad``); it must build the same module whatever device the LM is on
    (with more than one rank it is called on rank 0's loaded LM and on every rank's meta-device
    LM). ``check``: runs on the whole module before it is sharded, on rank 0 only (with one
    rank: the only one); what it raises stops every rank. ``role`` names the group in errors.
    ``attn_implementation``: transformers' attention implementation (None: its default).
    See the module docstring for how the weights reach each rank.
    """
    from agentrl.models.loading import attention_kwargs, load_causal_lm

    if world_size == 1:
        lm = load_causal_lm(name, dtype=dtype, attn_implementation=attn_implementation)
        module = make(lm)
        _train_in_float32(module)
        module.to(device)
        if check is not None:
            check(module)
        shard(module)
        return module

    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    source: torch.nn.Module | None = None
    header: dict[str, Any] = {}
    if rank == 0:
        try:
            source_lm = load_causal_lm(name, dtype="auto", attn_implementation=attn_implementation)  # the checkpoint's dtype
            source = make(source_lm)
            if check is not None:
                check(source)
            header = {
                "cls": type(source_lm),
                "config": source_lm.config,
                "generation_config": getattr(source_lm, "generation_config", None),
            }
        except Exception as exc:
            header = {"error": f"{type(exc).__name__}: {exc}"}
            dist.broadcast_object_list([header], src=0)
            raise
    box: list[Any] = [header]
    dist.broadcast_object_list(box, src=0)
    header = box[0]
    if "error" in header:
        raise LearnerError(f"{role} rank {rank}: rank 0 could not build the model {name!r}: {header['error']}")

    with torch.device("meta"):  # no storage: parameters get it, shard by shard, in to_empty
        lm = header["cls"]._from_config(header["config"], dtype=dtype, **attention_kwargs(attn_implementation))
        if header["generation_config"] is not None:
            lm.generation_config = header["generation_config"]
        module = make(lm)
    _train_in_float32(module)
    shard(module)
    module.to_empty(device=device)
    full = source.state_dict() if source is not None else {}
    set_model_state_dict(module, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    in_state = set(module.state_dict().keys())
    for key, buf in module.named_buffers():
        if key in in_state:
            continue
        if source is not None:
            buf.copy_(source.get_buffer(key))
        dist.broadcast(buf, src=0)
    del full, source
    return module
