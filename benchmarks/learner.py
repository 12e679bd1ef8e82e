"""Learner throughput: FSDP2 learner against a plain PyTorch loop, and token-budget micro-batching
against fixed-size micro-batches, in the same process on the same batch.

Configurations (one training step = forward/backward over the whole batch + one AdamW step,
the same objective, :func:`agentrl.algos.policy_loss`, everywhere):

- ``learner``: :class:`agentrl.engine.training.learner.Learner`, one FSDP2 rank over gloo, micro-batches
  planned by token budget (sorted by length), chunked chosen-token log-probs;
- ``plain``: a single-process loop over the *same* micro-batches with the bare transformers
  model (no FSDP, no process group), full logits and ``log_softmax``: the issue's reference;
- ``learner-fixed``: the learner with the planner replaced by fixed-size micro-batches in
  arrival order, sized for the longest possible sequence (``budget // max_len`` samples), the
  usual alternative to token budgets;
- ``learner-sorted-fixed``: the same fixed size, but the samples sorted by length (longest
  first) before they are cut into micro-batches: the strong fixed-size baseline (arrival order
  pads ~46% of the slots on the default batch, sorting most of that away);
- ``learner-shared``: the learner with shared prefixes (``learner.shared_prefixes = "on"``: the
  samples of one prompt laid out in one row, the prompt once, each sample's rest after it, under
  a 4-D attention mask; micro-batches planned over these units); with ``--group-size`` above 1
  the batch's samples come in groups that share their prompt, as GRPO's do;
- ``learner-packed``: the learner with packed micro-batches (``learner.pack_microbatches = "on"``:
  a micro-batch's samples end to end in one row, no padding, budgeted by their tokens); with the
  model's own attention implementation (sdpa on a CPU, where transformers masks the packed row
  block-causally; flash attention on a GPU runs each sample alone);
- ``learner-actor``: the learner as a run drives it: a Ray actor in a process of its own (one
  rank, ``torch_threads`` as the other configurations), set up and called through
  :class:`~agentrl.engine.training.learner_group.LearnerGroup` (the batch put in Ray's object
  store, the call awaited with its timeout); its row also splits the step (the rank's own
  ``step_*_s`` parts and the call's time beyond the rank's ``train_s``: the batch's way there and
  the metrics' way back). The in-process configurations hold no Ray; this one's overhead over
  ``learner`` is what the run adds to a step. Its CPU and memory columns count the benchmark's
  own process only (the rank computes in the actor's).

Every learner configuration but ``learner-shared`` runs with ``learner.shared_prefixes = "off"``
(each sample whole, as before the setting existed), so that the others keep measuring what they
name.

``--dtype bfloat16`` runs every configuration in bfloat16 as a bfloat16 run trains
(``model.dtype = "bfloat16"``): the learner configurations under FSDP2 mixed precision
(bfloat16 compute, float32 master weights and reductions), and ``plain`` as a plain loop does
it (float32 weights, the forward under ``torch.autocast("cpu", dtype=torch.bfloat16)``, as
TRL's ``bf16=True``). Each dtype writes a block of its own; the float32 and bfloat16 blocks of
one model, run one after the other, give bfloat16's speed-up.

The headline for micro-batching compares ``learner`` with the *strongest* fixed-size
configuration of the run (the one with the higher median tokens/s), and names it.

Each timed step also records the process's peak resident memory above what it held before the
step (``PeakRSS``): the memory the step itself needs at its worst moment (activations, logits,
gradients), which on a 49k-token vocabulary is where full-batch logits would show.

Configurations are interleaved, each run ``--repeats`` times for ``--steps`` steps after one
warm-up step; the table gives medians of wall-clock step time, of process CPU time per step (less
sensitive to other load on a shared machine) and of tokens/s (all tokens of the batch, prompt and
tool output included, padding excluded) and ratios, also as the median over repeats of each
repeat's own ratio (configurations of one repeat run back to back, so load that drifts cancels).
The batch mimics multi-turn episodes: lengths drawn log-normally between 48 and ``--max-len``
tokens, a ``--prompt``-token prompt (32), then alternating model-written (trained) and tool-output
segments; ``--group-size`` consecutive samples share their prompt (1: every prompt its own).

``--write`` puts the command, date, machine, repeats and steps, the batch and the table in
``benchmarks/RESULTS.md``, in a marked block of its own (key ``learner <configurations> <model>``,
the first time at the end of the ``## learner`` section; the prose around it is left alone).

    .venv/bin/python benchmarks/learner.py --repeats 7 --steps 2 --write
    .venv/bin/python benchmarks/learner.py --configs learner learner-sorted-fixed --repeats 5 --steps 2
    .venv/bin/python benchmarks/learner.py --configs learner learner-actor --repeats 5 --steps 2 --write
    .venv/bin/python benchmarks/learner.py --model runs/models/smollm2-135m-instruct \
        --samples 16 --repeats 3 --steps 1 --configs learner plain --write
"""

from __future__ import annotations

import argparse
import random
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _measure import PeakRSS, dtype_key, run_header, emit  # noqa: E402

from agentrl.algos import ObjectiveSettings, policy_loss  # noqa: E402
from agentrl.engine.training import fsdp_rank as planner_mod  # noqa: E402  (the module whose planner a rank calls)
from agentrl.engine.training.learner import Learner, token_logprobs  # noqa: E402
from agentrl.engine.training.microbatch import plan_microbatches  # noqa: E402
from agentrl.engine.training.shared_prefix import Sharing, key_cost, units_of  # noqa: E402


def make_batch(n: int, max_len: int, vocab: int, seed: int, group: int = 1, prompt: int = 32) -> list[dict[str, Any]]:
    """``n`` samples (see the module docstring); each run of ``group`` consecutive samples
    begins with the same ``prompt`` tokens."""
    rng = random.Random(seed)
    heads = random.Random(seed + 1)  # the shared prompts: the rest of the batch is drawn as with group 1
    out = []
    head: list[int] = []
    for i in range(n):
        length = int(min(max_len, max(prompt + 16, rng.lognormvariate(5.3, 0.5))))
        if group > 1 and i % group == 0:
            head = [heads.randrange(3, vocab) for _ in range(prompt)]
        mask = [0] * prompt
        while len(mask) < length:  # model turn, then tool output
            mask += [1] * rng.randint(16, 64) + [0] * rng.randint(8, 24)
        mask = mask[:length]
        out.append({
            "tokens": (head + [rng.randrange(3, vocab) for _ in range(length)][prompt:]) if group > 1 else [rng.randrange(3, vocab) for _ in range(length)],
            "loss_mask": mask,
            "behaviour_logprobs": [(-6.0 + rng.uniform(-0.1, 0.1)) if m else 0.0 for m in mask],
            "advantage": rng.choice([1.0, -1.0, 0.5, -0.5]),
        })
    return out


Planner = Callable[[list[int], int, int], list[list[int]]]
"""The signature of :func:`plan_microbatches`: (sample lengths, token budget, world size) to
micro-batches, each a list of sample indices."""


def repeat_order(configs: list[str], rep: int, rotate: bool) -> list[str]:
    """The order the configurations run in repeat ``rep`` (from 0): as given, or with ``rotate``
    starting at configuration ``rep`` modulo their number and wrapping around."""
    k = rep % len(configs) if rotate and configs else 0
    return configs[k:] + configs[:k]


CONFIGS = ("learner", "plain", "learner-fixed", "learner-sorted-fixed", "learner-packed", "learner-shared", "learner-actor")
"""Every configuration, in the order they run within a repeat; ``plain`` is the baseline."""
FIXED = ("learner-fixed", "learner-sorted-fixed")
"""The fixed-size micro-batch configurations, baselines for token-budget micro-batching."""


def fixed_plan(max_len: int, by_length: bool = False) -> Planner:
    """A stand-in for :func:`plan_microbatches`: ``budget // max_len`` samples per micro-batch
    (at least one), whatever their lengths; the samples in arrival order, or with ``by_length``
    sorted longest first (so each micro-batch holds samples of similar length). Empty
    micro-batches are appended until every rank gets the same number."""

    def plan(lengths: list[int], token_budget: int, world_size: int) -> list[list[int]]:
        k = max(1, token_budget // max_len)
        order = sorted(range(len(lengths)), key=lambda i: -lengths[i]) if by_length else list(range(len(lengths)))
        mbs = [order[i : i + k] for i in range(0, len(order), k)]
        while len(mbs) % world_size:
            mbs.append([])
        return mbs

    return plan


def padding_fraction(lengths: list[int], plan: list[list[int]]) -> float:
    """Padded slots over all slots of ``plan``: each micro-batch pads its samples to its longest."""
    slots = sum(max(lengths[i] for i in mb) * len(mb) for mb in plan if mb)
    return 1.0 - sum(lengths) / slots


class PlainLoop:
    """The reference: the same micro-batches, forward/backward/AdamW on a bare transformers model."""

    def __init__(self, model_path: str, lr: float, budget: int, dtype: torch.dtype = torch.float32) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        self.model.config.use_cache = False
        self.model.train()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr)
        self.budget = budget
        self.settings = ObjectiveSettings()
        self.autocast = dtype != torch.float32  # float32 weights, the forward in ``dtype`` (TRL's bf16=True)
        self.dtype = dtype

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
            with torch.autocast("cpu", dtype=self.dtype, enabled=self.autocast):
                logits = self.model(input_ids=ids, attention_mask=attn).logits
            lp = token_logprobs(logits[:, :-1].float(), ids[:, 1:])
            loss, _ = policy_loss(lp, behav[:, 1:], adv, mask[:, 1:], self.settings, num_tokens=n_tok)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


class ActorLearner:
    """The learner as a run drives it: one rank as a Ray actor (a local Ray of its own), set up
    and called through :class:`~agentrl.engine.training.learner_group.LearnerGroup`. ``parts``:
    per timed call, the rank's ``step_*_s`` parts and ``step_transfer_s`` (the call's time beyond
    the rank's ``train_s``)."""

    def __init__(self, model: str, budget: int, threads: int, dtype: str = "float32") -> None:
        import asyncio

        import ray

        from agentrl.engine.common.cluster import new_actor
        from agentrl.engine.training.learner_group import LearnerGroup
        from agentrl.engine.training.placement import LearnerPlacement, learner_bundles

        ray.init(num_cpus=max(2, threads), include_dashboard=False, log_to_driver=False)
        self.loop = asyncio.new_event_loop()
        self.group = LearnerGroup(
            num_ranks=1, factory=lambda rank, kwargs, options: new_actor(Learner, options, **kwargs),
            placement=lambda: LearnerPlacement(learner_bundles(1, 1, 0, {}), 120.0), timeout_s=1800.0,
            placement_timeout_s=120.0, name="learner",
        )
        self.loop.run_until_complete(self.group.start(
            {"world_size": 1, "model": model, "lr": 1e-5, "micro_batch_tokens": budget, "torch_threads": threads,
             "dtype": dtype, "shared_prefixes": "off"}))
        self.parts: list[dict[str, float]] = []

    def step(self, samples: list[dict[str, Any]]) -> None:
        t0 = time.perf_counter()
        m = self.loop.run_until_complete(self.group.call("train_step", samples, what="a benchmark step"))[0]
        took = time.perf_counter() - t0
        self.parts.append({**{k: v for k, v in m.items() if k.startswith("step_")}, "step_transfer_s": max(0.0, took - m["train_s"])})

    def close(self) -> None:
        import ray

        self.loop.run_until_complete(self.group.stop())
        self.loop.close()
        ray.shutdown()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for the learner's process group)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def strongest_fixed(tps: dict[str, float]) -> str | None:
    """The fixed-size configuration with the highest tokens/s in ``tps`` (configuration to
    median tokens/s), or None when the run has none."""
    fixed = [k for k in FIXED if k in tps]
    return max(fixed, key=lambda k: tps[k]) if fixed else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=64, help="samples per batch")
    ap.add_argument("--max-len", type=int, default=512, help="longest sample, tokens")
    ap.add_argument("--group-size", type=int, default=1, help="consecutive samples sharing their prompt (GRPO's group size)")
    ap.add_argument("--prompt", type=int, default=32, help="prompt tokens of each sample")
    ap.add_argument("--budget", type=int, default=4096, help="micro-batch token budget")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per repeat")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    ap.add_argument("--layers", type=int, default=4, help="tiny model depth (tiny_calc recipe: 4)")
    ap.add_argument("--model", default=None, help="a Hugging Face folder instead of the tiny model")
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS,
                    help="configurations to run (plain, the baseline, always runs)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                    help="the run's model.dtype every configuration trains in (bfloat16: mixed precision)")
    ap.add_argument("--rotate", action="store_true",
                    help="start each repeat one configuration later (repeat r runs them from the r-th on), so that "
                         "none always runs first or last in a repeat")
    ap.add_argument("--write", action="store_true",
                    help="put the command, batch and table in benchmarks/RESULTS.md (a block of its own)")
    args = ap.parse_args()
    configs = [c for c in CONFIGS if c in args.configs or c == "plain"]
    torch.set_num_threads(args.threads)
    started = time.time()

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

        hf_config = AutoConfig.from_pretrained(model)
        vocab = int(hf_config.vocab_size)
        batch = make_batch(args.samples, args.max_len, vocab, seed=0, group=args.group_size, prompt=args.prompt)
        lengths = [len(s["tokens"]) for s in batch]
        tokens = sum(lengths)
        trained = sum(sum(s["loss_mask"][1:]) for s in batch)

        def new_learner() -> Learner:
            ln = Learner(
                rank=0, world_size=1, master_addr="127.0.0.1", master_port=free_port(), model=model, lr=1e-5,
                micro_batch_tokens=args.budget, torch_threads=args.threads, dtype=args.dtype, shared_prefixes="off",
            )
            ln.setup()
            return ln

        real_plan = planner_mod.plan_microbatches
        planners: dict[str, Planner] = {
            "learner": real_plan,
            "plain": real_plan,  # the plain loop runs the learner's micro-batches
            "learner-fixed": fixed_plan(args.max_len),
            "learner-sorted-fixed": fixed_plan(args.max_len, by_length=True),
            "learner-packed": real_plan,  # the rank passes packed=True while this configuration runs
            "learner-shared": real_plan,  # the rank plans over its units while this configuration runs
            "learner-actor": real_plan,  # the rank in the actor plans with the real planner
        }
        plans = {k: real_plan(lengths, args.budget, 1, packed=True) if k == "learner-packed" else planners[k](lengths, args.budget, 1)
                 for k in configs if k != "learner-shared"}
        pad = {k: 0.0 if k == "learner-packed" else padding_fraction(lengths, plan) for k, plan in plans.items()}  # packed: no pad
        units = units_of([s["tokens"] for s in batch], [s["loss_mask"] for s in batch], args.budget, key_cost(hf_config.hidden_size))
        unit_lengths = [u.length(lengths) for u in units]
        if "learner-shared" in configs:  # padding: the slots beyond the units' rows
            plans["learner-shared"] = real_plan(unit_lengths, args.budget, 1)
            pad["learner-shared"] = padding_fraction(unit_lengths, plans["learner-shared"])
        n_mb = {k: len(plan) for k, plan in plans.items()}

        times: dict[str, list[float]] = {k: [] for k in configs}
        cpu: dict[str, list[float]] = {k: [] for k in times}
        peak: dict[str, list[int]] = {k: [] for k in times}
        per_repeat: list[dict[str, float]] = []  # per repeat: median step time of each configuration
        learner = new_learner()  # one process group, reused by every learner configuration
        params_m = sum(p.numel() for p in learner.policy.parameters()) / 1e6  # tied weights counted once
        actor = ActorLearner(model, args.budget, args.threads, args.dtype) if "learner-actor" in configs else None
        try:
            for rep in range(args.repeats):
                for name in repeat_order(configs, rep, args.rotate):
                    if name == "plain":
                        loop = PlainLoop(model, 1e-5, args.budget, getattr(torch, args.dtype))
                        step = loop.step
                    elif name == "learner-actor":
                        step = actor.step
                    else:
                        planner_mod.plan_microbatches = planners[name]
                        learner.packed = name == "learner-packed"  # what learner.pack_microbatches = "on" sets up
                        # what learner.shared_prefixes = "on" sets up
                        learner.sharing = (Sharing(learner.config._attn_implementation, learner.dtype, args.budget, key_cost(hf_config.hidden_size))
                                           if name == "learner-shared" else None)
                        step = learner.train_step
                    step(batch)  # warm-up
                    for _ in range(args.steps):
                        t0, c0 = time.perf_counter(), time.process_time()
                        with PeakRSS() as mem:
                            step(batch)
                        times[name].append(time.perf_counter() - t0)
                        cpu[name].append(time.process_time() - c0)
                        peak[name].append(mem.rise)
                    planner_mod.plan_microbatches = real_plan
                    learner.packed, learner.sharing = False, None
                    if name == "plain":
                        del loop, step  # its model and AdamW state leave before the next configuration
                rep_t = {k: statistics.median(v[-args.steps:]) for k, v in times.items()}
                per_repeat.append(rep_t)
                print(f"repeat {rep + 1}/{args.repeats}: " + ", ".join(f"{k} {tokens / t:,.0f} tok/s" for k, t in rep_t.items()), flush=True)
        finally:
            planner_mod.plan_microbatches = real_plan
            learner.shutdown()
            if actor is not None:
                actor.close()

    med = {k: statistics.median(v) for k, v in times.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    tps = {k: tokens / v for k, v in med.items()}

    def paired(name: str, base: str) -> float:
        """Median over repeats of (``base`` step time / ``name`` step time) within the repeat:
        ``name``'s speed-up over ``base``, > 1 is faster."""
        return statistics.median(r[base] / r[name] for r in per_repeat)

    best = strongest_fixed(tps)
    model_name = Path(args.model).name if args.model else "tiny"
    model_desc = (f"`{args.model}`" if args.model else
                  f"the tiny_calc model shape (Qwen2, hidden {hf_config.hidden_size}, {args.layers} layers, MLP 512, "
                  f"vocabulary {vocab})")
    model_desc += f", {params_m:.1f} M parameters"
    prompts = (f"shared by groups of {args.group_size} ({sum(unit_lengths):,} tokens laid out in shared-prefix units)"
               if args.group_size > 1 else "every one its own")
    lines = [
        f"{run_header(started)}. Model: {model_desc}; torch {torch.__version__}, {args.threads} torch threads; "
        + ("float32." if args.dtype == "float32" else
           "bfloat16: the learner configurations under FSDP2 mixed precision, plain under autocast over float32 weights."),
        "",
        f"Batch: {args.samples} samples, {tokens:,} tokens ({trained:,} trained), lengths {min(lengths)}..{max(lengths)} "
        f"(median {int(statistics.median(lengths))}), each with a {args.prompt}-token prompt, {prompts}; micro-batch budget {args.budget:,} tokens, fixed-size micro-batches "
        f"of {max(1, args.budget // args.max_len)} samples. Configurations interleaved"
        f"{' (each repeat starting one configuration later: none always first or last)' if args.rotate else ''}, {args.repeats} repeats × "
        f"{args.steps} timed steps each after one warm-up step; medians over all timed steps. tokens/s: all tokens "
        "of the batch per wall-clock second of a step; paired: the median over repeats of each repeat's own ratio.",
        "",
    ]
    head = ("| configuration | micro-batches | padding | median step (s) | CPU s per step | tokens/s "
            "| peak memory rise per step (MiB) | vs plain (medians) | vs plain (paired) |")
    align = "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    if best:
        head += f" vs {best} (medians) | vs {best} (paired) |"
        align += " ---: | ---: |"
    lines += [head, align]
    for name in configs:
        row = (f"| {name} | {n_mb[name]} | {pad[name]:.1%} | {med[name]:.3f} | {med_cpu[name]:.2f} | {tps[name]:,.0f} | "
               f"{statistics.median(peak[name]) / 2**20:,.0f} | {tps[name] / tps['plain']:.2f} | {paired(name, 'plain'):.2f} |")
        if best:
            row += f" {tps[name] / tps[best]:.2f} | {paired(name, best):.2f} |"
        lines.append(row)
    if best and "learner" in tps:
        others = ", ".join(f"{k} {tps[k]:,.0f}" for k in FIXED if k in tps and k != best)
        lines += [
            "",
            f"Token-budget micro-batching (`learner`) against the strongest fixed-size baseline of this run, "
            f"`{best}` (the fixed-size configuration with the highest median tokens/s: {tps[best]:,.0f}"
            + (f"; {others}" if others else "")
            + f"): **{tps['learner'] / tps[best]:.2f}×** tokens/s (medians), {paired('learner', best):.2f}× "
            f"(paired); CPU time per step {med_cpu['learner']:.2f} s against {med_cpu[best]:.2f} s; padding "
            f"{pad['learner']:.1%} against {pad[best]:.1%}.",
        ]
    timed_parts = [p for i, p in enumerate(actor.parts) if i % (args.steps + 1)] if actor is not None else []  # no warm-ups
    if timed_parts:
        parts = {k: statistics.median(p[k] for p in timed_parts) for k in timed_parts[0]}
        total = statistics.median(times["learner-actor"])
        lines += [
            "",
            f"Where a `learner-actor` step went (medians over its timed steps, seconds of a {total:.3f} s step): "
            + ", ".join(f"{k.removeprefix('step_').removesuffix('_s').replace('_', '/')} {v:.3f}" for k, v in parts.items())
            + ". transfer: the call's time beyond the rank's own train_s.",
        ]
    text = "\n".join(lines)
    emit(text, dtype_key(f"learner {' '.join(configs)} {model_name}", args.dtype), args.write, section="learner")


if __name__ == "__main__":
    main()
