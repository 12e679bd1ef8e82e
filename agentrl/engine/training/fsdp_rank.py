"""One rank of an FSDP2 data-parallel group: what the learner and the critic share.

:class:`FsdpRank` owns the parts of a training rank that do not depend on what is trained:

- **set-up**: the seed, the torch threads on CPU, joining the group's ``torch.distributed``
  process group (:func:`~agentrl.engine.training.devices.join_process_group`), and sharding a model with
  ``fully_shard`` per decoder layer and then as a whole (:func:`per_layer_units`: one rank on
  the CPU gets one unit around the whole model instead);
- **the work plan**: mini-batches (:func:`~agentrl.engine.training.microbatch.split_minibatches`) and this
  rank's share of the micro-batches (:func:`~agentrl.engine.training.microbatch.plan_microbatches`), with
  a two-token **stand-in** micro-batch of zero weight for a rank that has nothing to do in a
  round (FSDP's collectives must match across ranks);
- **the clipped update**: gradient clipping, AdamW, the LR schedule when there is one, and a
  skipped update (counted) when the gradient norm is not finite;
- **the per-row gather**: a per-position quantity (log-probs, values) computed on each rank's
  share and gathered so that every rank returns the whole list;
- **offload** (colocated on GPUs): the parameters and optimizer states in host memory while vLLM
  generates, back on the device for the next computation (:mod:`agentrl.engine.training.offload`);
- **checkpoints**: the sharded model and AdamW state, each rank's RNG state and
  ``trainer_state.json``, in a folder that appears atomically
  (:mod:`agentrl.engine.training.checkpoint`);
- **shutdown**: leaving the process group.

A subclass (:class:`~agentrl.engine.training.learner.Learner`, :class:`~agentrl.engine.training.critic.Critic`)
builds its model in ``setup()`` and names it in :meth:`FsdpRank.trained_module`; it defines its
micro-batch type (:meth:`FsdpRank.make_batch`) and the row a stand-in micro-batch is made of
(:meth:`FsdpRank.stand_in_row`). Every method that touches the model is a collective of the
rank's group: call it on every rank with the same arguments.
"""

from __future__ import annotations

import abc
import contextlib
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from agentrl.engine.training.devices import gather_rows, join_process_group
from agentrl.engine.training.microbatch import plan_microbatches, split_minibatches
from agentrl.engine.training.offload import move_states
from agentrl.engine.training.padded import PaddedBatch
from agentrl.engine.training.shared_prefix import Sharing, units_of
from agentrl.errors import ConfigError, LearnerError

__all__ = ["FsdpRank", "PendingCheckpoint", "decoder_layers", "per_layer_units"]


@dataclass(frozen=True)
class PendingCheckpoint:
    """A checkpoint being written in the background: the write's ``future``, the hidden folder
    it writes into (``tmp``), where the folder goes once written (``final``) and, on rank 0, the
    event set once its attempt to put it there when written is over (``placed``)."""

    future: Future[Any]
    tmp: Path
    final: Path
    placed: threading.Event | None = None


def decoder_layers(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder layers of a Hugging Face causal LM (``model.model.layers``), or of any module
    whose submodules' class names end in ``DecoderLayer`` (a critic's trunk): FSDP's units."""
    inner = getattr(module, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is not None:
        return list(layers)
    return [m for m in module.modules() if type(m).__name__.endswith("DecoderLayer")]


def per_layer_units(world_size: int, device: torch.device) -> bool:
    """Whether each decoder layer is an FSDP unit of its own (True) or the whole model is one.

    FSDP2 computes on an unsharded copy of each unit's parameters (in the compute dtype), also
    with one rank: it copies the shard into a buffer of the full size (torch 2.13,
    ``FSDPParamGroup.wait_for_unshard``). With one unit that copy is the whole model for the
    whole forward and backward pass; with a unit per layer it is a layer or two at a time
    (freed after each layer's forward and backward). On a GPU the copy is the memory that
    counts (for a LoRA base, a second copy of the whole base), so every rank shards per layer; one
    rank on the CPU keeps one unit, where per-layer hooks and copies cost a small model's step
    about a fifth of its time and memory is plentiful. ``world_size > 1`` always shards per
    layer (that is what spreads the memory over the ranks)."""
    return world_size > 1 or device.type != "cpu"


class FsdpRank(abc.ABC):
    """One rank of an FSDP2 group (see the module docstring). ``role`` names the group in
    messages and in the process group's rendezvous ("learner", "critic").

    ``rank``/``world_size``/``master_addr``/``master_port``: the group and where it meets;
    ``model``: the folder or hub id the subclass loads; ``lr``, ``betas``, ``weight_decay``,
    ``adam_eps``: AdamW; ``grad_clip``: the gradient-norm clip; ``updates_per_batch``: optimizer
    updates per batch (contiguous mini-batches); ``micro_batch_tokens``: padded tokens per
    forward pass; ``torch_threads``: torch's threads on CPU; ``timeout_s``: the collective
    timeout; ``seed``: torch's seed before the model is built.
    """

    role = "rank"

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        master_addr: str,
        master_port: int,
        model: str,
        lr: float = 1e-5,
        betas: tuple[float, float] = (0.9, 0.999),
        weight_decay: float = 0.0,
        adam_eps: float = 1e-8,
        grad_clip: float = 1.0,
        updates_per_batch: int = 1,
        micro_batch_tokens: int = 8192,
        torch_threads: int = 1,
        timeout_s: float = 900.0,
        seed: int = 0,
    ) -> None:
        if updates_per_batch < 1 or micro_batch_tokens < 1:
            raise ConfigError(f"{self.role}: updates_per_batch and micro_batch_tokens must be >= 1")
        self.rank, self.world_size = rank, world_size
        self.master_addr, self.master_port = master_addr, master_port
        self.model_name = model
        self.lr, self.betas, self.weight_decay, self.adam_eps = lr, betas, weight_decay, adam_eps
        self.grad_clip = grad_clip
        self.updates_per_batch, self.micro_batch_tokens = updates_per_batch, micro_batch_tokens
        self.torch_threads, self.timeout_s, self.seed = torch_threads, timeout_s, seed
        self.device = torch.device("cpu")
        self.pad_id = 0
        self.packed = False
        """Micro-batches are packed, one row each (see :class:`PaddedBatch`), not padded."""
        self.sharing: Sharing | None = None
        """Micro-batches lay the samples that share a prompt out in units (see
        :mod:`agentrl.engine.training.shared_prefix`); None: every sample whole."""
        self.optimizer: Any = None
        self.scheduler: Any = None
        """The LR schedule (a ``LambdaLR``), or None: a constant learning rate."""
        self.step = 0
        """Completed training steps (``train_step`` calls; the learner's ``sft_step`` too)."""
        self.updates = 0
        """Completed optimizer updates, skipped ones included."""
        self.skipped_updates = 0
        """Updates skipped because the gradient norm was not finite."""
        self.offloaded = False
        """Whether the parameters and optimizer states are in host memory (:meth:`offload_states`)."""
        self._pending_checkpoint: PendingCheckpoint | None = None
        """A checkpoint being written in the background (:meth:`save_state` with ``background``)."""
        self._checkpoint_group: Any = None
        """The CPU process group background checkpoint writes coordinate over (made at the first)."""

    # ------------------------------------------------------------------ what a subclass defines
    @abc.abstractmethod
    def trained_module(self) -> Any:
        """The FSDP-wrapped module this rank trains, or None before ``setup()``."""
        raise NotImplementedError

    @abc.abstractmethod
    def make_batch(self, rows: list[dict[str, Any]], with_targets: bool) -> PaddedBatch:
        """The padded micro-batch of ``rows``; ``with_targets``: read the training targets too."""
        raise NotImplementedError

    @abc.abstractmethod
    def stand_in_row(self) -> dict[str, Any]:
        """A two-token row with every field :meth:`make_batch` reads (it is given zero weight)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ set-up
    def join_group(self) -> str:
        """Seed torch, join the group's process group and, when the rank computes on the CPU, set
        torch's threads; returns the backend (``gloo``, or the device-mapped NCCL one on GPU) and
        sets ``self.device``. The device decides, not ``torch.cuda.is_available()``: a rank Ray
        gave no GPU on a GPU node (a CPU critic) computes on the CPU and keeps to its threads."""
        torch.manual_seed(self.seed)
        backend, self.device = join_process_group(
            self.rank, self.world_size, self.master_addr, self.master_port, self.timeout_s, self.role
        )
        if self.device.type == "cpu":
            torch.set_num_threads(self.torch_threads)
        return backend

    def shard(self, root: torch.nn.Module, layers_of: torch.nn.Module, **fsdp: Any) -> None:
        """``fully_shard`` each decoder layer of ``layers_of`` (when :func:`per_layer_units`
        says so), then ``root`` as a whole; ``fsdp``: ``fully_shard``'s keyword arguments
        (``mp_policy``)."""
        from torch.distributed.fsdp import fully_shard

        if per_layer_units(self.world_size, self.device):
            for layer in decoder_layers(layers_of):
                fully_shard(layer, **fsdp)
        fully_shard(root, **fsdp)

    def build_optimizer(self, lr_lambda: Callable[[int], float] | None = None) -> None:
        """AdamW over the trained module's parameters that require gradients, and the LR
        schedule ``lr_lambda`` (the factor of update ``k``) when given. On a GPU AdamW is the
        fused kernel: torch's default multi-tensor AdamW allocates a temporary as large as all
        the moments of a kind at each update, which sets a full fine-tuning rank's peak memory
        (4 bytes a parameter above the 16 it plans for); the fused one works tensor by tensor
        in one kernel. On the CPU it stays the default."""
        params = [p for p in self.trained_module().parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            params, lr=self.lr, betas=self.betas, eps=self.adam_eps, weight_decay=self.weight_decay,
            **({"fused": True} if self.device.type == "cuda" else {}),
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda) if lr_lambda else None

    def require_setup(self) -> None:
        """Raise :class:`LearnerError` unless ``setup()`` has run."""
        if self.trained_module() is None:
            raise LearnerError(f"{self.role} not set up (call setup() on every rank first)")

    @contextlib.contextmanager
    def leave_group_on_failure(self) -> Iterator[None]:
        """A context for building the model in ``setup()``: if it raises, the process group is
        destroyed before the error goes on (a rank that cannot build leaves no group behind)."""
        try:
            yield
        except BaseException:
            if dist.is_initialized():
                dist.destroy_process_group()
            raise

    # ------------------------------------------------------------------ offload (colocated on GPUs)
    def offload_states(self) -> float:
        """Move the parameters and optimizer states to host memory, so that vLLM has the GPU to
        itself while it generates (:mod:`agentrl.engine.training.offload`); the next method that
        computes brings them back. Seconds it took; 0.0 on a CPU rank (nothing to free) or when
        they are away already."""
        if self.device.type == "cpu" or self.offloaded:
            return 0.0
        t0 = time.monotonic()
        move_states(self.trained_module(), self.optimizer, torch.device("cpu"))
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        self.offloaded = True
        return time.monotonic() - t0

    def reload_states(self) -> float:
        """Bring offloaded parameters and optimizer states back to the rank's device. Seconds it
        took; 0.0 when they are there."""
        if not self.offloaded:
            return 0.0
        t0 = time.monotonic()
        move_states(self.trained_module(), self.optimizer, self.device)
        if self.device.type == "cuda" and torch.cuda.is_available():
            torch.cuda.synchronize(self.device)  # the copies are asynchronous
        self.offloaded = False
        return time.monotonic() - t0

    @contextlib.contextmanager
    def states_on_device(self) -> Iterator[None]:
        """The states on the device for the body (a checkpoint, an export, log-probs), then back
        where they were: an offloaded rank stays offloaded outside it."""
        was_offloaded = self.offloaded
        self.reload_states()
        try:
            yield
        finally:
            if was_offloaded:
                self.offload_states()

    # ------------------------------------------------------------------ the work plan
    def minibatches(self, n: int) -> list[list[int]]:
        """Sample indices ``0..n-1`` in ``updates_per_batch`` contiguous parts (none for n = 0)."""
        return split_minibatches(n, self.updates_per_batch) if n else []

    def plan(self, rows: list[dict[str, Any]]) -> list[list[int]]:
        """The micro-batch plan of ``rows`` (every rank computes the same one). With
        :attr:`sharing` the plan weighs units (each sample's unit stays in one micro-batch)."""
        lengths = [len(r["tokens"]) for r in rows]
        if self.sharing is None:
            return plan_microbatches(lengths, self.micro_batch_tokens, self.world_size, packed=self.packed)
        units = units_of([r["tokens"] for r in rows], [r["loss_mask"] for r in rows], self.sharing.budget, self.sharing.key_cost)
        plan = plan_microbatches([u.length(lengths) for u in units], self.micro_batch_tokens, self.world_size)
        return [[i for k in micro for i in units[k].rows] for micro in plan]

    def my_share(self, rows: list[dict[str, Any]], plan: list[list[int]], with_targets: bool) -> Iterator[tuple[list[int], PaddedBatch, bool]]:
        """This rank's micro-batches of ``plan`` over ``rows``: ``(indices, batch, real)``;
        ``real`` is False for a stand-in (a rank with nothing to do in that round)."""
        for micro in plan[self.rank :: self.world_size]:
            if micro:
                yield micro, self.make_batch([rows[i] for i in micro], with_targets), True
            else:
                yield micro, self.make_batch([self.stand_in_row()], with_targets), False

    # ------------------------------------------------------------------ the update
    def optimizer_update(self) -> tuple[float, bool]:
        """Clip the gradient norm, step AdamW and the schedule; a non-finite norm skips the
        optimizer step (counted in ``skipped_updates``). Returns ``(norm, finite)``."""
        grad_norm = torch.nn.utils.clip_grad_norm_(self.trained_module().parameters(), self.grad_clip)
        if hasattr(grad_norm, "full_tensor"):
            grad_norm = grad_norm.full_tensor()
        norm = float(grad_norm)
        finite = math.isfinite(norm)
        if finite:
            self.optimizer.step()
        else:
            self.skipped_updates += 1
        self.optimizer.zero_grad(set_to_none=True)
        if self.scheduler is not None:
            self.scheduler.step()
        self.updates += 1
        return norm, finite

    # ------------------------------------------------------------------ the per-row gather
    @torch.no_grad()
    def per_row(self, rows: list[dict[str, Any]], padded_of: Callable[[PaddedBatch], torch.Tensor]) -> list[list[float]]:
        """A per-position quantity of every row, laid out like its tokens: entry ``t`` is what
        ``padded_of(batch)`` (``[B, T-1]``, position ``t - 1`` is about token ``t``) gives for
        token ``t``; entry 0 is 0.0. Computed on this rank's share, gathered: every rank returns
        the whole list (collective)."""
        self.trained_module().eval()
        mine: dict[int, list[float]] = {}
        for micro, batch, real in self.my_share(rows, self.plan(rows), with_targets=False):
            values = padded_of(batch).cpu()
            if not real:
                continue
            for b, i in enumerate(micro):
                n = len(rows[i]["tokens"])
                mine[i] = [0.0] + values[b, : n - 1].tolist()
        mine = gather_rows(mine, self.world_size)
        return [mine[i] for i in range(len(rows))]

    # ------------------------------------------------------------------ checkpoints
    def save_state(
        self, out_dir: str, module: torch.nn.Module, state: dict[str, Any], write_extra: Callable[[Path], None] | None = None,
        background: bool = False,
    ) -> str:
        """Write a checkpoint of ``module`` and the optimizer (collective): the sharded state,
        each rank's RNG state, ``trainer_state.json`` (``state`` plus the step, the update
        counts and whether optimizer state is there) and, on rank 0, what ``write_extra(folder)``
        adds. The folder appears atomically; an existing one is replaced.

        ``background``: return once the state is copied to host memory (a snapshot: training may
        go on) and write the sharded state in a thread; the folder appears at ``out_dir`` when
        :meth:`finish_checkpoint` is called (collective), which the next checkpoint also does
        first (a load or a shutdown lets the write end and leaves the folder hidden). Costs a
        second copy of the weights and optimizer state in host memory while it is written."""
        from agentrl.engine.training.checkpoint import (
            close_collective_folder,
            open_collective_folder,
            put_in_place_when_written,
            save_rng_state,
            save_sharded_state,
            saves_optimizer_state,
            start_sharded_save,
            write_trainer_state,
        )

        self.require_setup()
        self.finish_checkpoint()
        final = Path(out_dir)
        try:
            tmp = open_collective_folder(final, self.rank, ("rng",))
            # every rank's own files first: a background write ends (on rank 0, which then puts
            # the folder in place) only after every rank's thread wrote its share, so all is there
            has_optim = saves_optimizer_state(self.optimizer)
            save_rng_state(tmp / "rng" / f"rank{self.rank}.pt")
            if self.rank == 0:
                write_trainer_state(tmp, {
                    "step": self.step,
                    "updates": self.updates,
                    "skipped_updates": self.skipped_updates,
                    "has_optimizer_state": has_optim,
                    "world_size": self.world_size,
                    "model": self.model_name,
                    **({"scheduler": self.scheduler.state_dict()} if self.scheduler is not None else {}),
                    **state,
                })
                if write_extra is not None:
                    write_extra(tmp)
            if background:
                if self._checkpoint_group is None:
                    self._checkpoint_group = dist.new_group(backend="gloo")
                future, _ = start_sharded_save(module, self.optimizer, tmp, self._checkpoint_group)
                # in place as soon as it is written (rank 0), not only at finish_checkpoint
                placed = put_in_place_when_written(future, tmp, final) if self.rank == 0 else None
                self._pending_checkpoint = PendingCheckpoint(future, tmp, final, placed)
            else:
                save_sharded_state(module, self.optimizer, tmp)
                close_collective_folder(tmp, final, self.rank)
        except LearnerError:
            raise
        except Exception as exc:
            raise LearnerError(f"{self.role} rank {self.rank}: saving the checkpoint {final} failed: {exc}") from exc
        return str(final)

    def finish_checkpoint(self) -> dict[str, Any] | None:
        """Wait for the checkpoint being written in the background, if any, and make sure its
        folder is in place (collective; rank 0 puts it there as soon as the write ends). Returns
        ``{"path": its folder, "wait_s": seconds this call waited}``, or None when none was being
        written. A failed write raises :class:`LearnerError` (the folder stays hidden: the
        previous checkpoint is still the newest)."""
        from agentrl.engine.training.checkpoint import close_collective_folder

        pending, self._pending_checkpoint = self._pending_checkpoint, None
        if pending is None:
            return None
        t0 = time.monotonic()
        try:
            pending.future.result(timeout=self.timeout_s)
            if pending.placed is not None:
                pending.placed.wait(self.timeout_s)
            wait_s = time.monotonic() - t0
            close_collective_folder(pending.tmp, pending.final, self.rank, written_already=True)
        except Exception as exc:
            raise LearnerError(f"{self.role} rank {self.rank}: writing the checkpoint {pending.final} in the background failed: {exc}") from exc
        return {"path": str(pending.final), "wait_s": wait_s}

    def load_state(self, checkpoint_dir: str, module: torch.nn.Module) -> dict[str, Any]:
        """Restore what :meth:`save_state` wrote (collective, possibly by another number of
        ranks: the state is re-sharded; each rank's RNG state is restored when the checkpoint
        has one for its rank). Returns the trainer state."""
        from agentrl.engine.training.checkpoint import load_rng_state, load_sharded_state, read_trainer_state

        self.require_setup()
        self.abandon_checkpoint()
        folder = Path(checkpoint_dir)
        state = read_trainer_state(folder)
        try:
            load_sharded_state(module, self.optimizer, folder, bool(state["has_optimizer_state"]))
            if self.scheduler is not None and "scheduler" in state:
                self.scheduler.load_state_dict(state["scheduler"])
            rng = folder / "rng" / f"rank{self.rank}.pt"
            if rng.is_file():
                load_rng_state(rng)
        except Exception as exc:
            raise LearnerError(f"{self.role} rank {self.rank}: loading the checkpoint {folder} failed: {exc}") from exc
        self.step = int(state["step"])
        self.updates = int(state.get("updates", 0))
        self.skipped_updates = int(state.get("skipped_updates", 0))
        return state

    def abandon_checkpoint(self) -> None:
        """Let a checkpoint being written in the background end (bounded: ``timeout_s``), whether
        it succeeds or not, and leave its folder hidden (not a collective): what a load (the
        state it saved is being replaced) and a shutdown do with one nobody finished."""
        pending, self._pending_checkpoint = self._pending_checkpoint, None
        if pending is not None:
            with contextlib.suppress(Exception):
                pending.future.result(timeout=self.timeout_s)

    def shutdown(self) -> None:
        """Let a checkpoint being written in the background end (:meth:`abandon_checkpoint`),
        then leave the process group."""
        self.abandon_checkpoint()
        if dist.is_initialized():
            dist.destroy_process_group()

    def identity(self) -> dict[str, Any]:
        """What ``setup()`` reports about this rank besides its model: rank and pid."""
        return {"rank": self.rank, "pid": os.getpid()}

