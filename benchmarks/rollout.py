"""Rollout throughput: multi-turn tool episodes through the engine against raw vLLM.

For each concurrency level C, runs ``--episodes`` Calc-v0 episodes (model turns, code in the
bubblewrap sandbox, interpreter output appended, next turn) through the engine's rollout path
(``play_episode`` over :class:`~agentrl.engine.generator.Generator`), then, in the same process
and on the same engine(s), raw vLLM generation of exactly the same number of tokens per episode
for the same prompts (one request each, ``ignore_eos``) at the same concurrency. Reports
generated tokens/s of both and their ratio, median over ``--repeats``; also 1 vs 2 generators.

    .venv/bin/python benchmarks/rollout.py --model runs/tiny_calc/sft --concurrency 8 32 64 128

The model should be one that calls the tool (e.g. the SFT stage of ``recipes/tiny_calc.toml``),
so that episodes really are multi-turn.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

import anyio


async def _engine_pass(gens: list[Any], tok: Any, rows: list[dict], concurrency: int, sandbox: Any) -> tuple[float, list[int], list[list[int]], float]:
    from agentrl.engine.rollout import play_episode
    from agentrl.envs.calc import CalcEnv

    sem = asyncio.Semaphore(concurrency)
    out: list[Any] = [None] * len(rows)

    async def one(i: int) -> None:
        async with sem:
            env = CalcEnv(sandbox=sandbox, max_turns=3, timeout_s=5.0)
            gen = gens[i % len(gens)]
            out[i] = await play_episode(
                env, tok, gen.generate, row=rows[i], group_id=f"g{i}", prompt_index=i, sample_index=0, seed=0,
                sampling={"temperature": 1.0, "stop": ["</code>"]}, max_new_tokens=48, max_episode_tokens=512,
            )

    t0 = time.monotonic()
    await asyncio.gather(*[one(i) for i in range(len(rows))])
    wall = time.monotonic() - t0
    generated = [t.num_generated for t in out]
    prompts = [t.tokens[: next(j for j, m in enumerate(t.loss_mask) if m)] if any(t.loss_mask) else t.tokens for t in out]
    turns = statistics.mean(t.metrics["turns"] for t in out)
    return wall, generated, prompts, turns


async def _raw_pass(gens: list[Any], prompts: list[list[int]], lengths: list[int], concurrency: int) -> float:
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with sem:
            await gens[i % len(gens)].generate(prompts[i], {"temperature": 1.0, "max_tokens": max(1, lengths[i]), "ignore_eos": True})

    t0 = time.monotonic()
    await asyncio.gather(*[one(i) for i in range(len(prompts))])
    return time.monotonic() - t0


async def main_async(args: argparse.Namespace) -> None:
    from agentrl.engine.generator import EngineSettings, Generator
    from agentrl.envs.data import load_rows
    from agentrl.models.loading import load_tokenizer
    from agentrl.sandbox import create_sandbox

    tok = load_tokenizer(args.model)
    rows = load_rows("synthetic:calc", limit=args.episodes, seed=123)
    sandbox = create_sandbox("bubblewrap", max_concurrency=8, timeout_s=5.0, memory_mb=256)
    results = []
    for n_gen in args.generators:
        gens = [Generator(EngineSettings(model=args.model, max_model_len=1024, kv_cache_gib=0.5, cpu_threads_bind=args.bind)) for _ in range(n_gen)]
        for g in gens:
            await g.start()
        for c in args.concurrency:
            for _ in range(args.repeats):
                wall_e, lengths, prompts, turns = await _engine_pass(gens, tok, rows, c, sandbox)
                wall_r = await _raw_pass(gens, prompts, lengths, c)
                tokens = sum(lengths)
                results.append({"generators": n_gen, "concurrency": c, "engine": tokens / wall_e, "raw": tokens / wall_r, "turns": turns, "tokens": tokens})
        for g in gens:
            await g.shutdown()
    await sandbox.aclose()
    print(f"\nCalc-v0 episodes: {args.episodes} per pass, {args.repeats} repeats (median), model {args.model}\n")
    print("| generators | concurrent episodes | engine tok/s | raw vLLM tok/s | ratio | turns/episode |")
    print("| --- | --- | --- | --- | --- | --- |")
    for n_gen in args.generators:
        for c in args.concurrency:
            rs = [r for r in results if r["generators"] == n_gen and r["concurrency"] == c]
            e = statistics.median(r["engine"] for r in rs)
            raw = statistics.median(r["raw"] for r in rs)
            ratio = statistics.median(r["engine"] / r["raw"] for r in rs)
            print(f"| {n_gen} | {c} | {e:.0f} | {raw:.0f} | {ratio:.2f} | {statistics.median(r['turns'] for r in rs):.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a Hugging Face folder (a tool-calling tiny model)")
    ap.add_argument("--episodes", type=int, default=128)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[8, 32, 64, 128])
    ap.add_argument("--generators", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--bind", default="0-1", help="VLLM_CPU_OMP_THREADS_BIND")
    args = ap.parse_args()
    if not Path(args.model).exists():
        raise SystemExit(f"{args.model}: not a folder")
    anyio.run(main_async, args)


if __name__ == "__main__":
    main()
