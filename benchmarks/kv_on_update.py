"""KV cache at a weight update: dropped (requests in flight re-prefill) against kept.

``generator.recompute_kv_on_update`` (default true) drops the engine's KV cache at each in-flight
weight update, so requests in flight re-encode their context with the new weights and each
token's version label is exact; false keeps the cache (no re-prefill). This measures what the
choice costs: two vLLM engines on the same model, one per setting, each serving ``--requests``
long requests (``--prompt-tokens`` of prompt, ``--max-tokens`` to write, ignoring EOS) while the
same weights are loaded from disk as new versions ``--updates`` times, ``--gap-s`` apart.
Reported per setting: the median generation stall of an update (pause to resume) and the
tokens/s the requests wrote over the whole round (updates included); rounds alternate between
the engines ``--repeats`` times, and the ratio is the median of per-round ratios.

    .venv/bin/python benchmarks/kv_on_update.py --model runs/models/tiny-bench --write
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

from _measure import run_header, emit


async def _round(g: Any, folder: str, args: argparse.Namespace, first_version: int) -> dict[str, float]:
    """One round on engine ``g``: the requests run while ``args.updates`` versions load."""
    prompts = [[5 + (i * 7 + j) % 200 for j in range(args.prompt_tokens)] for i in range(args.requests)]
    sampling = {"max_tokens": args.max_tokens, "temperature": 1.0, "ignore_eos": True}
    t0 = time.monotonic()
    tasks = [asyncio.ensure_future(g.generate(p, sampling)) for p in prompts]
    stalls = []
    for k in range(args.updates):
        await asyncio.sleep(args.gap_s)
        if all(t.done() for t in tasks):
            break
        stalls.append(await g.update_weights(first_version + k, folder))
    outs = await asyncio.gather(*tasks)
    wall = time.monotonic() - t0
    return {"stall": statistics.median(stalls) if stalls else float("nan"), "updates": float(len(stalls)),
            "tok_s": sum(len(o.token_ids) for o in outs) / wall}


async def main_async(args: argparse.Namespace) -> str:
    from agentrl.engine.generation.generator import EngineSettings, VllmGenerator

    settings = {
        label: EngineSettings(model=args.model, max_model_len=args.prompt_tokens + args.max_tokens + 16, kv_cache_gib=0.25,
                              recompute_kv_on_update=recompute)
        for label, recompute in (("recompute", True), ("keep", False))
    }
    rows: dict[str, list[dict[str, float]]] = {label: [] for label in settings}
    started = time.time()
    engines = {label: VllmGenerator(s, timeout_s=600) for label, s in settings.items()}
    for g in engines.values():
        await g.start()
    try:
        version = 1
        for rep in range(args.repeats + 1):  # round 0 warms both engines up, not counted
            order = list(engines) if rep % 2 == 0 else list(reversed(engines))
            for label in order:
                r = await _round(engines[label], args.model, args, version)
                version += args.updates
                if rep:
                    rows[label].append(r)
    finally:
        for g in engines.values():
            await g.shutdown()
    ratio_stall = statistics.median(k["stall"] / r["stall"] for k, r in zip(rows["keep"], rows["recompute"]))
    ratio_tps = statistics.median(k["tok_s"] / r["tok_s"] for k, r in zip(rows["keep"], rows["recompute"]))
    lines = [
        f"{run_header(started)}. Two vLLM engines (CPU) on `{Path(args.model).name}`; per round {args.requests} requests of "
        f"{args.prompt_tokens} prompt + {args.max_tokens} generated tokens while up to {args.updates} versions load from disk "
        f"{args.gap_s:g} s apart; {args.repeats} rounds per setting, alternating, after a warm-up round; medians.",
        "",
        "| KV cache at an update | stall per update, s | tokens/s of the requests | updates per round |",
        "| --- | ---: | ---: | ---: |",
    ]
    for label, text in (("recompute", "dropped: requests re-prefill (default)"), ("keep", "kept")):
        rs = rows[label]
        lines.append(
            f"| {text} | {statistics.median(r['stall'] for r in rs):.3f} | {statistics.median(r['tok_s'] for r in rs):.0f} | "
            f"{statistics.median(r['updates'] for r in rs):.0f} |"
        )
    lines += ["", f"Kept / dropped, median of per-round ratios: stall {ratio_stall:.2f}x, tokens/s {ratio_tps:.2f}x."]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a Hugging Face folder")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--updates", type=int, default=4)
    ap.add_argument("--gap-s", type=float, default=0.5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--write", action="store_true", help="put the table in benchmarks/RESULTS.md (a block of its own)")
    args = ap.parse_args()
    if not Path(args.model).is_dir():
        raise SystemExit(f"{args.model}: not a folder")
    text = asyncio.run(main_async(args))
    emit(text, f"kv_on_update {Path(args.model).name}", args.write, section="weight sync")


if __name__ == "__main__":
    main()
