"""Learner throughput: FSDP2 learner against a plain PyTorch loop, and token-budget micro-batching
against fixed-size micro-batches, in the same process on the same batch.

Configurations (one training step = forward/backward over the whole batch + one AdamW step,
the same objective, :func:`agentrl.algos.policy_loss`, everywhere):

- ``learner``: :class:`agentrl.engine.learner.Learner`, one FSDP2 rank over gloo, micro-batches
  planned by token budget (sorted by length), chunked chosen-token log-probs;
- ``plain``: a single-process loop over the *same* micro-batches with the bare transformers
  model (no FSDP, no process group), full logits and ``log_softmax``: the issue's reference;
- ``learner-fixed``: the learner with the planner replaced by fixed-size micro-batches in
  arrival order, sized for the longest possible sequence (``budget // max_len`` samples), the
  usual alternative to token budgets: the baseline for the micro-batching.

Each timed step also records the process's peak resident memory above what it held before the
step (``PeakRSS``): the memory the step itself needs at its worst moment (activations, logits,
gradients), which on a 49k-token vocabulary is where full-batch logits would show.

Configurations are interleaved, each run ``--repeats`` times for ``--steps`` steps after one
warm-up step; the table gives medians of wall-clock step time, of process CPU time per step (less
sensitive to other load on a shared machine) and of tokens/s (all tokens of the batch, prompt and
tool output included, padding excluded) and ratios, also as the median over repeats of each
repeat's own ratio (configurations of one repeat run back to back, so load that drifts cancels).
The batch mimics multi-turn episodes: lengths drawn log-normally between 48 and ``--max-len``
tokens, a 32-token prompt, then alternating model-written (trained) and tool-output segments.

    .venv/bin/python benchmarks/learner.py --repeats 7 --steps 2
    .venv/bin/python benchmarks/learner.py --model runs/models/smollm2-135m-instruct \
        --samples 16 --repeats 3 --steps 1 --configs learner plain
"""

from __future__ import annotations

import argparse
import random
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _measure import PeakRSS  # noqa: E402

from agentrl.algos import ObjectiveSettings, policy_loss  # noqa: E402
from agentrl.engine import learner as learner_mod  # noqa: E402
from agentrl.engine.learner import Learner, plan_microbatches, token_logprobs  # noqa: E402


def make_batch(n: int, max_len: int, vocab: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        length = int(min(max_len, max(48, rng.lognormvariate(5.3, 0.5))))
        mask = [0] * 32
        while len(mask) < length:  # model turn, then tool output
            mask += [1] * rng.randint(16, 64) + [0] * rng.randint(8, 24)
        mask = mask[:length]
        out.append({
            "tokens": [rng.randrange(3, vocab) for _ in range(length)],
            "loss_mask": mask,
            "behaviour_logprobs": [(-6.0 + rng.uniform(-0.1, 0.1)) if m else 0.0 for m in mask],
            "advantage": rng.choice([1.0, -1.0, 0.5, -0.5]),
        })
    return out


def fixed_plan(max_len: int):
    """A stand-in for :func:`plan_microbatches`: ``budget // max_len`` samples per micro-batch,
    in arrival order."""

    def plan(lengths: list[int], token_budget: int, world_size: int) -> list[list[int]]:
        k = max(1, token_budget // max_len)
        mbs = [list(range(i, min(len(lengths), i + k))) for i in range(0, len(lengths), k)]
        while len(mbs) % world_size:
            mbs.append([])
        return mbs

    return plan


def padding_fraction(lengths: list[int], plan: list[list[int]]) -> float:
    slots = sum(max(lengths[i] for i in mb) * len(mb) for mb in plan if mb)
    return 1.0 - sum(lengths) / slots


class PlainLoop:
    """The reference: the same micro-batches, forward/backward/AdamW on a bare transformers model."""

    def __init__(self, model_path: str, lr: float, budget: int) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        self.model.config.use_cache = False
        self.model.train()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr)
        self.budget = budget
        self.settings = ObjectiveSettings()

    def step(self, samples: list[dict[str, Any]]) -> None:
        plan = plan_microbatches([len(s["tokens"]) for s in samples], self.budget, 1)
        n_tok = float(sum(sum(1 for m in s["loss_mask"][1:] if m) for s in samples))
        for mb in plan:
            rows = [samples[i] for i in mb]
            T = max(len(r["tokens"]) for r in rows)
            ids = torch.zeros(len(rows), T, dtype=torch.long)
            attn = torch.zeros_like(ids)
            mask = torch.zeros(len(rows), T)
            behav = torch.zeros(len(rows), T)
            for b, r in enumerate(rows):
                n = len(r["tokens"])
                ids[b, :n] = torch.tensor(r["tokens"])
                attn[b, :n] = 1
                mask[b, :n] = torch.tensor(r["loss_mask"], dtype=torch.float32)
                behav[b, :n] = torch.tensor(r["behaviour_logprobs"])
            adv = torch.tensor([float(r["advantage"]) for r in rows])
            logits = self.model(input_ids=ids, attention_mask=attn).logits
            lp = token_logprobs(logits[:, :-1], ids[:, 1:])
            loss, _ = policy_loss(lp, behav[:, 1:], adv, mask[:, 1:], self.settings, num_tokens=n_tok)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=64, help="samples per batch")
    ap.add_argument("--max-len", type=int, default=512, help="longest sample, tokens")
    ap.add_argument("--budget", type=int, default=4096, help="micro-batch token budget")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per repeat")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    ap.add_argument("--layers", type=int, default=4, help="tiny model depth (tiny_calc recipe: 4)")
    ap.add_argument("--model", default=None, help="a Hugging Face folder instead of the tiny model")
    ap.add_argument("--configs", nargs="+", default=["learner", "plain", "learner-fixed"],
                    choices=["learner", "plain", "learner-fixed"], help="configurations to run (plain is the baseline)")
    args = ap.parse_args()
    configs = [c for c in ("learner", "plain", "learner-fixed") if c in args.configs or c == "plain"]
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            from agentrl.envs.corpus import tokenizer_corpus
            from agentrl.envs.data import load_rows
            from agentrl.models.tiny import TinyModelSpec, build_tiny_model

            rows = load_rows("synthetic:calc", limit=500)
            spec = TinyModelSpec(num_layers=args.layers, intermediate_size=512)
            model = str(build_tiny_model(Path(tmp) / "tiny", tokenizer_corpus("agentrl/Calc-v0", rows), spec))
        from transformers import AutoConfig

        vocab = int(AutoConfig.from_pretrained(model).vocab_size)
        batch = make_batch(args.samples, args.max_len, vocab, seed=0)
        lengths = [len(s["tokens"]) for s in batch]
        tokens = sum(lengths)
        trained = sum(sum(s["loss_mask"][1:]) for s in batch)

        def new_learner() -> Learner:
            ln = Learner(
                rank=0, world_size=1, master_addr="127.0.0.1", master_port=free_port(), model=model, lr=1e-5,
                micro_batch_tokens=args.budget, torch_threads=args.threads,
            )
            ln.setup()
            return ln

        real_plan = learner_mod.plan_microbatches
        naive_plan = fixed_plan(args.max_len)
        pad = {
            "learner": padding_fraction(lengths, real_plan(lengths, args.budget, 1)),
            "learner-fixed": padding_fraction(lengths, naive_plan(lengths, args.budget, 1)),
        }
        pad["plain"] = pad["learner"]
        n_mb = {"learner": len(real_plan(lengths, args.budget, 1)), "learner-fixed": len(naive_plan(lengths, args.budget, 1))}
        n_mb["plain"] = n_mb["learner"]

        times: dict[str, list[float]] = {k: [] for k in configs}
        cpu: dict[str, list[float]] = {k: [] for k in times}
        peak: dict[str, list[int]] = {k: [] for k in times}
        paired: list[dict[str, float]] = []  # per repeat: plain step time / this configuration's
        learner = new_learner()  # one process group, reused by both learner configurations
        try:
            for rep in range(args.repeats):
                for name in configs:
                    if name == "plain":
                        loop = PlainLoop(model, 1e-5, args.budget)
                        step = loop.step
                    else:
                        learner_mod.plan_microbatches = real_plan if name == "learner" else naive_plan
                        step = learner.train_step
                    step(batch)  # warm-up
                    for _ in range(args.steps):
                        t0, c0 = time.perf_counter(), time.process_time()
                        with PeakRSS() as mem:
                            step(batch)
                        times[name].append(time.perf_counter() - t0)
                        cpu[name].append(time.process_time() - c0)
                        peak[name].append(mem.rise)
                    learner_mod.plan_microbatches = real_plan
                    if name == "plain":
                        del loop, step  # its model and AdamW state leave before the next configuration
                rep_t = {k: statistics.median(v[-args.steps:]) for k, v in times.items()}
                paired.append({k: rep_t["plain"] / t for k, t in rep_t.items()})
                print(f"repeat {rep + 1}/{args.repeats}: " + ", ".join(f"{k} {tokens / t:,.0f} tok/s" for k, t in rep_t.items()), flush=True)
        finally:
            learner_mod.plan_microbatches = real_plan
            learner.shutdown()

    med = {k: statistics.median(v) for k, v in times.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    tps = {k: tokens / v for k, v in med.items()}
    print()
    print(f"batch: {args.samples} samples, {tokens} tokens ({trained} trained), lengths {min(lengths)}..{max(lengths)} "
          f"(median {int(statistics.median(lengths))}), budget {args.budget} tokens/micro-batch, {args.threads} threads, "
          f"{args.repeats} repeats x {args.steps} steps")
    print()
    print("| configuration | micro-batches | padding | median step (s) | CPU s per step | tokens/s | peak memory rise per step (MiB) "
          "| vs plain (medians) | vs plain (paired, median of repeats) | vs learner-fixed |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in configs:
        pair = statistics.median(p[name] for p in paired)
        vs_fixed = f"{tps[name] / tps['learner-fixed']:.2f}" if "learner-fixed" in tps else "-"
        print(f"| {name} | {n_mb[name]} | {pad[name]:.1%} | {med[name]:.3f} | {med_cpu[name]:.2f} | {tps[name]:,.0f} | "
              f"{statistics.median(peak[name]) / 2**20:,.0f} | {tps[name] / tps['plain']:.2f} | {pair:.2f} | {vs_fixed} |")


if __name__ == "__main__":
    main()
