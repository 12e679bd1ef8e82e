"""Learner: one rank of an FSDP2 data-parallel group that trains the policy.

``Learner`` is a plain class (one per process); the controller wraps it as a Ray actor and calls
every rank's method at the same time (they run collectives together). The model is wrapped per
decoder layer with ``torch.distributed.fsdp.fully_shard``; the process group is ``gloo`` on CPU
and ``nccl`` on GPU.

A training sample is a dict with ``tokens``, ``loss_mask``, ``behaviour_logprobs`` (per token,
as in :class:`~agentrl.engine.trajectory.Trajectory`) and ``advantage`` (one float).
"""

from __future__ import annotations

import datetime
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from agentrl.algos import ppo_clip_loss
from agentrl.errors import LearnerError

__all__ = ["Learner", "plan_microbatches", "token_logprobs", "write_hf_folder"]


def plan_microbatches(lengths: list[int], token_budget: int, world_size: int) -> list[list[int]]:
    """Group sample indices into micro-batches of at most ``token_budget`` padded tokens.

    Samples are sorted by length (longest first) so that padding stays small; a sample longer
    than the budget gets a micro-batch of its own. The number of micro-batches is padded with
    empty ones to a multiple of ``world_size`` so that every rank runs the same number of
    forward/backward passes (FSDP collectives must match). Every rank computes the same plan;
    rank ``r`` takes micro-batches ``r, r + world_size, ...``.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    plan: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        new_longest = max(longest, lengths[i])
        if current and new_longest * (len(current) + 1) > token_budget:
            plan.append(current)
            current, new_longest = [], lengths[i]
        current.append(i)
        longest = new_longest
    if current:
        plan.append(current)
    while len(plan) % world_size:
        plan.append([])
    return plan


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Log-probability of each target token: ``logits[t, target] - logsumexp(logits[t])``.

    ``logits`` is ``[B, T, V]`` and ``targets`` ``[B, T]``; the result is ``[B, T]`` in float32.
    No full-vocabulary log-softmax tensor is kept beyond the logits themselves.
    """
    logits = logits.float()
    chosen = torch.gather(logits, -1, targets.unsqueeze(-1)).squeeze(-1)
    return chosen - torch.logsumexp(logits, dim=-1)


def write_hf_folder(state_dict: dict[str, torch.Tensor], config: Any, out_dir: Path, tokenizer: Any = None) -> Path:
    """Write a Hugging Face model folder atomically (a temporary sibling renamed into place).

    Tied output embeddings (``config.tie_word_embeddings``) are written once, as transformers
    and vLLM expect. Readers never see a half-written folder.
    """
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in state_dict.items()}
    if getattr(config, "tie_word_embeddings", False):
        tensors.pop("lm_head.weight", None)
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(tmp)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)
    return out_dir


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is not None:
        return list(layers)
    return [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]


class Learner:
    """One learner rank. Call ``setup()`` on every rank before anything else."""

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        master_addr: str,
        master_port: int,
        model: str,
        dtype: str = "float32",
        lr: float = 1e-5,
        betas: tuple[float, float] = (0.9, 0.999),
        weight_decay: float = 0.0,
        grad_clip: float = 1.0,
        warmup_steps: int = 0,
        micro_batch_tokens: int = 8192,
        clip_low: float = 0.2,
        clip_high: float = 0.28,
        torch_threads: int = 1,
        timeout_s: float = 900.0,
        seed: int = 0,
    ) -> None:
        self.rank, self.world_size = rank, world_size
        self.master_addr, self.master_port = master_addr, master_port
        self.model_name = model
        self.dtype = getattr(torch, dtype)
        self.lr, self.betas, self.weight_decay = lr, betas, weight_decay
        self.grad_clip, self.warmup_steps = grad_clip, warmup_steps
        self.micro_batch_tokens = micro_batch_tokens
        self.clip_low, self.clip_high = clip_low, clip_high
        self.torch_threads, self.timeout_s, self.seed = torch_threads, timeout_s, seed
        self.step = 0
        self.model: Any = None

    def setup(self) -> dict[str, Any]:
        """Join the process group, load and shard the model, build the optimizer."""
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        from agentrl.models.loading import load_causal_lm

        torch.manual_seed(self.seed)
        on_gpu = torch.cuda.is_available()
        if not on_gpu:
            torch.set_num_threads(self.torch_threads)
        backend = "nccl" if on_gpu else "gloo"
        if on_gpu:
            torch.cuda.set_device(0)
        self.device = torch.device("cuda", 0) if on_gpu else torch.device("cpu")
        try:
            dist.init_process_group(
                backend,
                init_method=f"tcp://{self.master_addr}:{self.master_port}",
                rank=self.rank,
                world_size=self.world_size,
                timeout=datetime.timedelta(seconds=self.timeout_s),
            )
        except Exception as exc:
            raise LearnerError(f"rank {self.rank}: cannot join the process group: {exc}") from exc
        model = load_causal_lm(self.model_name, dtype=torch.float32 if not on_gpu else self.dtype)
        model.to(self.device)
        model.config.use_cache = False
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if on_gpu and self.dtype == torch.bfloat16 else MixedPrecisionPolicy()
        for layer in _decoder_layers(model):
            fully_shard(layer, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        self.model = model
        self.config = model.config
        self.pad_id = int(getattr(model.config, "pad_token_id", None) or 0)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=self.lr, betas=self.betas, weight_decay=self.weight_decay)
        warm = self.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0
        )
        n_params = sum(p.numel() for p in model.parameters())
        return {"rank": self.rank, "backend": backend, "parameters": n_params, "pid": os.getpid()}

    def _forward_logprobs(self, rows: list[dict[str, Any]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Pad a micro-batch; return (learner logprobs, behaviour logprobs, mask, advantages), all ``[B, T-1]``."""
        longest = max(len(r["tokens"]) for r in rows)
        B = len(rows)
        ids = torch.full((B, longest), self.pad_id, dtype=torch.long)
        attn = torch.zeros((B, longest), dtype=torch.long)
        mask = torch.zeros((B, longest), dtype=torch.float32)
        old = torch.zeros((B, longest), dtype=torch.float32)
        adv = torch.zeros((B, longest), dtype=torch.float32)
        for b, r in enumerate(rows):
            n = len(r["tokens"])
            ids[b, :n] = torch.tensor(r["tokens"])
            attn[b, :n] = 1
            mask[b, :n] = torch.tensor(r["loss_mask"], dtype=torch.float32)
            old[b, :n] = torch.tensor(r["behaviour_logprobs"], dtype=torch.float32)
            adv[b, :n] = float(r["advantage"])
        ids, attn = ids.to(self.device), attn.to(self.device)
        logits = self.model(input_ids=ids, attention_mask=attn).logits
        lp = token_logprobs(logits[:, :-1], ids[:, 1:])
        dev = lp.device
        return lp, old[:, 1:].to(dev), mask[:, 1:].to(dev), adv[:, 1:].to(dev)

    def train_step(self, samples: list[dict[str, Any]]) -> dict[str, float]:
        """One optimizer step on the whole batch (every rank receives the same list).

        The loss is the PPO-clip loss against the behaviour log-probabilities, averaged over all
        trained tokens of the batch (token-mean). Returns metrics summed across ranks.
        """
        if self.model is None:
            raise LearnerError("learner not set up")
        t0 = time.monotonic()
        self.model.train()
        total_tokens = sum(sum(s["loss_mask"][1:]) for s in samples)
        scale = self.world_size / max(1, total_tokens)
        plan = plan_microbatches([len(s["tokens"]) for s in samples], self.micro_batch_tokens, self.world_size)
        mine = plan[self.rank :: self.world_size]
        acc = torch.zeros(6, dtype=torch.float64)  # loss, clipped, ratio_sum, |lp-old| sum, tokens, padded
        for mb in mine:
            if not mb:  # keeps FSDP collectives in step across ranks
                dummy = torch.full((1, 2), self.pad_id, dtype=torch.long, device=self.device)
                (self.model(input_ids=dummy).logits.sum() * 0.0).backward()
                continue
            rows = [samples[i] for i in mb]
            lp, old, mask, adv = self._forward_logprobs(rows)
            loss, stats = ppo_clip_loss(lp, old, adv, mask, clip_low=self.clip_low, clip_high=self.clip_high)
            (loss * scale).backward()
            acc += torch.tensor(
                [
                    loss.item(),
                    stats["clipped"].item(),
                    stats["ratio_sum"].item(),
                    ((lp.detach() - old).abs() * mask).sum().item(),
                    mask.sum().item(),
                    float(lp.numel()),
                ],
                dtype=torch.float64,
            )
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        if hasattr(grad_norm, "full_tensor"):
            grad_norm = grad_norm.full_tensor()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.step += 1
        if self.world_size > 1:
            dist.all_reduce(acc)
        tokens = max(1.0, acc[4].item())
        return {
            "loss": acc[0].item() / tokens,
            "clip_fraction": acc[1].item() / tokens,
            "ratio_mean": acc[2].item() / tokens,
            "logprob_abs_diff": acc[3].item() / tokens,
            "trained_tokens": acc[4].item(),
            "padding_fraction": 1.0 - acc[4].item() / max(1.0, acc[5].item()),
            "grad_norm": float(grad_norm),
            "lr": self.scheduler.get_last_lr()[0],
            "step": float(self.step),
            "train_s": time.monotonic() - t0,
        }

    def sft_step(self, samples: list[dict[str, Any]]) -> dict[str, float]:
        """One supervised optimizer step: mean negative log-likelihood of the tokens whose
        ``loss_mask`` is 1 (assistant tokens), over the whole batch. ``samples`` need only
        ``tokens`` and ``loss_mask``. Returns metrics summed across ranks."""
        if self.model is None:
            raise LearnerError("learner not set up")
        t0 = time.monotonic()
        self.model.train()
        total_tokens = sum(sum(s["loss_mask"][1:]) for s in samples)
        scale = self.world_size / max(1, total_tokens)
        plan = plan_microbatches([len(s["tokens"]) for s in samples], self.micro_batch_tokens, self.world_size)
        acc = torch.zeros(3, dtype=torch.float64)  # nll sum, tokens, correct (argmax) tokens
        for mb in plan[self.rank :: self.world_size]:
            if not mb:
                dummy = torch.full((1, 2), self.pad_id, dtype=torch.long, device=self.device)
                (self.model(input_ids=dummy).logits.sum() * 0.0).backward()
                continue
            rows = [dict(samples[i], behaviour_logprobs=[0.0] * len(samples[i]["tokens"]), advantage=0.0) for i in mb]
            lp, _, mask, _ = self._forward_logprobs(rows)
            nll = -(lp * mask).sum()
            (nll * scale).backward()
            acc += torch.tensor([nll.item(), mask.sum().item(), ((lp.detach() > -0.6931) * mask).sum().item()], dtype=torch.float64)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        if hasattr(grad_norm, "full_tensor"):
            grad_norm = grad_norm.full_tensor()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.step += 1
        if self.world_size > 1:
            dist.all_reduce(acc)
        tokens = max(1.0, acc[1].item())
        return {
            "sft_loss": acc[0].item() / tokens,
            "sft_token_p_gt_half": acc[2].item() / tokens,
            "trained_tokens": acc[1].item(),
            "grad_norm": float(grad_norm),
            "lr": self.scheduler.get_last_lr()[0],
            "train_s": time.monotonic() - t0,
        }

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Gather the unsharded parameters (a collective: call on every rank); CPU tensors on rank 0,
        an empty dict elsewhere."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def publish(self, out_dir: str, with_tokenizer: bool = False) -> str | None:
        """Write the current weights as a Hugging Face folder at ``out_dir`` (collective; rank 0
        writes, atomically). Returns the path on rank 0, ``None`` elsewhere."""
        sd = self.full_state_dict()
        if self.rank != 0:
            return None
        tokenizer = None
        if with_tokenizer:
            from agentrl.models.loading import load_tokenizer

            tokenizer = load_tokenizer(self.model_name)
        return str(write_hf_folder(sd, self.config, Path(out_dir), tokenizer))

    def shutdown(self) -> None:
        """Leave the process group."""
        if dist.is_initialized():
            dist.destroy_process_group()
