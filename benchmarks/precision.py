"""Precision: float32 and bfloat16 on each side, generator (vLLM) and learner (FSDP2), on the same
tokens: how far apart their log-probs are, and what each costs here.

The off-policy corrections (decoupled PPO's importance weight, the mismatch metrics) read the
generator's log-probs as the behaviour policy's. A gap between what vLLM sampled with and what
the learner computes for the same weights is a bias the corrections cannot see. This measures it
for each pairing:

- vLLM in float32 or bfloat16 samples ``--prompts`` chat prompts, ``--tokens`` tokens each at
  temperature 1 (seeded), and reports its per-token log-probs and its decode time;
- a learner rank in float32, or in bfloat16 mixed precision (:mod:`agentrl.dtype_plan`: float32
  master weights, bfloat16 compute, logits in float32), computes the log-probs of the same
  tokens, and one training step on them is timed.

The table gives, per pairing, the largest and mean |log pi_learner - log pi_vLLM| over the
generated tokens, the 99th percentile, and the share of tokens whose importance weight
``exp(|delta|)`` is off by more than 1 % (|delta| > 0.01); then per side the time each dtype took,
and ``auto``'s choice on this machine (:func:`agentrl.dtype_plan.plan_dtype`).

``--write`` puts it in ``benchmarks/RESULTS.md`` (block ``precision <model>`` on a CPU without bfloat16
units, ``precision <model> <units>`` on one with them, as torch reports them: ``avx512_bf16``,
``amx``), so that both kinds of machine keep their figures.

    .venv/bin/python benchmarks/precision.py --model runs/models/smollm2-135m-instruct --write
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks._measure import emit, quantile, run_header  # noqa: E402

QUESTIONS = [
    "What is 17 times 23? Explain briefly.",
    "Write Python that prints the first five squares.",
    "Name three prime numbers above 50 and say why they are prime.",
    "Compute 347*58+91 step by step.",
    "A train goes 120 km in 1.5 hours. What is its speed?",
    "What is the derivative of x^3 + 2x?",
    "Give two uses of a hash map.",
    "How many minutes are in a week?",
]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _sample(model: str, dtype: str, prompts: list[list[int]], tokens: int) -> tuple[list[dict[str, Any]], float, float]:
    """vLLM in ``dtype`` samples ``tokens`` tokens for each prompt: the samples (tokens, loss
    mask, behaviour log-probs), the engine's start-up seconds and its decode seconds per token."""
    from agentrl.engine.generation.generator import EngineSettings, VllmGenerator

    t0 = time.perf_counter()
    gen = VllmGenerator(EngineSettings(model=model, dtype=dtype, max_model_len=512, kv_cache_gib=0.25), timeout_s=600)
    await gen.start()
    startup = time.perf_counter() - t0
    try:
        await gen.generate(prompts[0], {"max_tokens": 4, "temperature": 1.0, "seed": 0})  # warm-up
        t = time.perf_counter()
        outs = await asyncio.gather(*[
            gen.generate(p, {"max_tokens": tokens, "temperature": 1.0, "seed": 100 + i, "ignore_eos": True})
            for i, p in enumerate(prompts)
        ])
        decode = time.perf_counter() - t
    finally:
        await gen.shutdown()
    samples = [
        {"tokens": p + o.token_ids, "loss_mask": [0] * len(p) + [1] * len(o.token_ids),
         "behaviour_logprobs": [0.0] * len(p) + list(o.logprobs), "versions": [-1] * len(p) + list(o.versions),
         "advantage": 1.0 if i % 2 else -1.0}
        for i, (p, o) in enumerate(zip(prompts, outs))
    ]
    generated = sum(len(o.token_ids) for o in outs)
    return samples, startup, decode / max(generated, 1)


def _learner(model: str, dtype: str) -> Any:
    from agentrl.engine.training.learner import Learner

    learner = Learner(rank=0, world_size=1, master_addr="127.0.0.1", master_port=_port(), model=model, dtype=dtype,
                      lr=1e-6, grad_clip=1.0, micro_batch_tokens=4096, logprob_chunk_tokens=256, seed=0)
    learner.setup()
    return learner


def _gaps(learner: Any, samples: list[dict[str, Any]]) -> list[float]:
    mine = learner.compute_logprobs(samples)
    return [abs(a - b) for s, lp in zip(samples, mine) for a, b, m in zip(lp, s["behaviour_logprobs"], s["loss_mask"]) if m]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="runs/models/smollm2-135m-instruct", help="a Hugging Face folder")
    ap.add_argument("--prompts", type=int, default=8, help=f"chat prompts (at most {len(QUESTIONS)})")
    ap.add_argument("--tokens", type=int, default=48, help="tokens sampled per prompt")
    ap.add_argument("--steps", type=int, default=2, help="timed training steps per learner dtype (after one warm-up)")
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    ap.add_argument("--write", action="store_true", help="put the table and the command in benchmarks/RESULTS.md")
    args = ap.parse_args()
    if not Path(args.model).is_dir():
        raise SystemExit(f"{args.model}: not a folder")
    import torch

    from agentrl.dtype_plan import cpu_bf16_units, measure_cpu_bf16_speedup, plan_dtype
    from agentrl.models.loading import load_tokenizer

    started = time.time()
    tok = load_tokenizer(args.model)
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=True, add_generation_prompt=True)
               for q in QUESTIONS[: args.prompts]]
    prompts = [list(p["input_ids"]) if isinstance(p, dict) or hasattr(p, "keys") else list(p) for p in prompts]
    sampled: dict[str, tuple[list[dict[str, Any]], float, float]] = {}
    for d in args.dtypes:
        sampled[d] = asyncio.run(_sample(args.model, d, prompts, args.tokens))
        print(f"vLLM {d}: start-up {sampled[d][1]:.1f} s, {1e3 * sampled[d][2]:.1f} ms per generated token", flush=True)
    gaps: dict[tuple[str, str], list[float]] = {}
    step_s: dict[str, float] = {}
    for ld in args.dtypes:
        learner = _learner(args.model, ld)
        try:
            for vd in args.dtypes:
                gaps[(vd, ld)] = _gaps(learner, sampled[vd][0])
                g = gaps[(vd, ld)]
                print(f"vLLM {vd} / learner {ld}: max |d| {max(g):.3g}, mean {statistics.fmean(g):.3g}", flush=True)
            batch = sampled[args.dtypes[0]][0]
            learner.train_step(batch)  # warm-up
            times = []
            for _ in range(args.steps):
                t = time.perf_counter()
                learner.train_step(batch)
                times.append(time.perf_counter() - t)
            step_s[ld] = statistics.median(times)
            print(f"learner {ld}: {step_s[ld]:.2f} s per step", flush=True)
        finally:
            learner.shutdown()
    ratio = measure_cpu_bf16_speedup()
    plan = plan_dtype("auto", gpu=False, cpu_speedup=lambda: ratio)
    n_tokens = len(gaps[(args.dtypes[0], args.dtypes[0])])
    batch_tokens = sum(len(s["tokens"]) for s in sampled[args.dtypes[0]][0])
    lines = [
        f"{run_header(started)}. Model {Path(args.model).name}; {len(prompts)} chat prompts, {args.tokens} tokens each sampled "
        f"at temperature 1 by vLLM (CPU, seeded), {n_tokens} generated tokens per pairing; one FSDP2 learner rank "
        f"(gloo, torch threads: {torch.get_num_threads()}) computes their log-probs. |delta| = |log pi_learner - log pi_vLLM| "
        "per generated token, nats; 'IW off > 1 %': the share of tokens whose importance weight exp(delta) is more than "
        "1 % from 1.",
        "",
        "| vLLM | learner | max abs delta | mean abs delta | p99 abs delta | IW off > 1 % |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for (vd, ld), g in gaps.items():
        off = sum(1 for x in g if x > 0.01) / len(g)
        lines.append(f"| {vd} | {ld} | {max(g):.3g} | {statistics.fmean(g):.3g} | {quantile(g, 0.99):.3g} | {100 * off:.1f} % |")
    lines += [
        "",
        f"Cost on this machine (median of {args.steps} training steps after a warm-up, on the {batch_tokens}-token batch; "
        "decode: the batch of prompts at once, seconds per generated token):",
        "",
        "| dtype | vLLM start-up, s | vLLM decode, ms/token | learner step, s |",
        "| --- | ---: | ---: | ---: |",
    ]
    for d in args.dtypes:
        lines.append(f"| {d} | {sampled[d][1]:.1f} | {1e3 * sampled[d][2]:.1f} | {step_s[d]:.2f} |")
    lines += ["", f"`model.dtype = \"auto\"` on this machine resolves to {plan.dtype}: {plan.reason.removeprefix('auto: ')}."]
    # one block per kind of CPU: with bfloat16 units the costs (and the kernels' rounding) differ
    units = cpu_bf16_units()
    key = f"precision {Path(args.model).name}" + ("" if units == "none" else f" {units}")
    emit("\n".join(lines), key, args.write, section="SmolLM2-135M-Instruct (a real pretrained model)")


if __name__ == "__main__":
    main()
