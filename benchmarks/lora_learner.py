"""Learner step time: LoRA (adapter only) against full fine-tuning, same model, same batch.

Each configuration runs in its own process (one learner rank over gloo per process: a process
holds one process group), the two alternating ``--repeats`` times; each process times ``--steps``
training steps after one warm-up step on the batch of ``benchmarks/learner.py`` (multi-turn-like
lengths, trained and tool-output segments). Reports medians of step time, CPU time per step and
tokens/s, the trainable parameters, and the paired ratio (each repeat's full / LoRA step time).

    .venv/bin/python benchmarks/lora_learner.py --repeats 3 --steps 3 --write
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _measure import emit, run_header  # noqa: E402


def child(args: argparse.Namespace) -> None:
    """One configuration: set a learner up, time its steps, print one JSON line."""
    import torch
    from learner import free_port, make_batch

    from agentrl.engine.training.learner import Learner

    lora = {"rank": args.lora_rank, "alpha": 2.0 * args.lora_rank} if args.child == "lora" else None
    ln = Learner(
        rank=0, world_size=1, master_addr="127.0.0.1", master_port=free_port(), model=args.model, lr=1e-5,
        micro_batch_tokens=args.budget, torch_threads=args.threads, lora=lora,
    )
    info = ln.setup()
    batch = make_batch(args.samples, args.max_len, int(ln.vocab_size), seed=0)
    ln.train_step(batch)  # warm-up
    times, cpu = [], []
    for _ in range(args.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        ln.train_step(batch)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    ln.shutdown()
    print(json.dumps({
        "step_s": statistics.median(times), "cpu_s": statistics.median(cpu), "tokens": sum(len(s["tokens"]) for s in batch),
        "parameters": info["parameters"], "trainable": info["trainable_parameters"], "torch": torch.__version__,
    }))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="a Hugging Face folder (default: a tiny_calc-shaped model built here)")
    ap.add_argument("--lora-rank", type=int, default=16)
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--max-len", type=int, default=512)
    ap.add_argument("--budget", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--child", choices=["full", "lora"], help=argparse.SUPPRESS)
    ap.add_argument("--write", action="store_true", help="put the table and the command in benchmarks/RESULTS.md")
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            from agentrl.envs.corpus import tokenizer_corpus
            from agentrl.envs.data import load_rows
            from agentrl.models.tiny import TinyModelSpec, build_tiny_model

            spec = TinyModelSpec(num_layers=4, intermediate_size=512)
            model = str(build_tiny_model(Path(tmp) / "tiny", tokenizer_corpus("agentrl/Calc-v0", load_rows("synthetic:calc", limit=500)), spec))
        runs: dict[str, list[dict]] = {"full": [], "lora": []}
        for rep in range(args.repeats):
            for kind in ("full", "lora"):
                cmd = [sys.executable, __file__, "--child", kind, "--model", model, "--lora-rank", str(args.lora_rank),
                       "--samples", str(args.samples), "--max-len", str(args.max_len), "--budget", str(args.budget),
                       "--steps", str(args.steps), "--threads", str(args.threads)]
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, cwd=str(Path(__file__).parent))
                if out.returncode != 0:
                    raise SystemExit(out.stderr[-3000:])
                runs[kind].append(json.loads(out.stdout.strip().splitlines()[-1]))
                print(f"repeat {rep + 1}/{args.repeats} {kind}: {runs[kind][-1]['step_s']:.3f} s/step", flush=True)
    med = {k: statistics.median(r["step_s"] for r in v) for k, v in runs.items()}
    cpu = {k: statistics.median(r["cpu_s"] for r in v) for k, v in runs.items()}
    paired = statistics.median(f["step_s"] / lo["step_s"] for f, lo in zip(runs["full"], runs["lora"]))
    tokens = runs["full"][0]["tokens"]
    label = Path(args.model).name if args.model else "tiny (tiny_calc shape)"
    lines = [
        f"{run_header(started)}. Model: {label}, {runs['full'][0]['parameters'] / 1e6:.1f} M parameters; batch of "
        f"{args.samples} samples ({tokens:,} tokens), micro-batch budget {args.budget:,}; {args.threads} torch threads; "
        f"{args.repeats} repeats alternating, {args.steps} timed steps each after a warm-up; medians.",
        "",
        "| configuration | trainable parameters | median step (s) | CPU s per step | tokens/s | full / this (paired) |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for k, label_k in (("full", "full fine-tuning"), ("lora", f"LoRA rank {args.lora_rank}, all linear layers")):
        ratio = "1.00" if k == "full" else f"{paired:.2f}"
        lines.append(f"| {label_k} | {runs[k][0]['trainable'] / 1e6:.2f} M | {med[k]:.3f} | {cpu[k]:.2f} | {tokens / med[k]:,.0f} | {ratio} |")
    emit("\n".join(lines), f"lora_learner {Path(args.model).name if args.model else 'tiny'}", args.write, section="## learner")


if __name__ == "__main__":
    main()
