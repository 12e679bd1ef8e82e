"""Async (bounded staleness) against sync (on-policy) RL: wall-clock for the same samples.

Runs ``agentrl train`` on the same recipe, seed and number of learner steps (hence the same
number of trained samples) in ``sync`` mode (``max_staleness = 0``: generate a batch, train,
update, repeat) and in ``async`` mode with ``max_staleness`` 1, 2 and 4, ``--repeats`` times
each, interleaved, and prints the median RL-loop wall-clock (first step started to last step
done, engine start-up excluded) with its ratio to sync measured in the same run, and the busy
fractions of the generator (a request in flight) and the learner (training or writing weights)
from the run's ``utilisation`` record.

    .venv/bin/python benchmarks/async_vs_sync.py --steps 20 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from agentrl.cli import train_command

REPO = Path(__file__).resolve().parents[1]


def run_once(mode: str, staleness: int, steps: int, model: Path, workdir: Path, extra: list[str]) -> dict:
    run_dir = workdir / f"{mode}-{staleness}-{len(list(workdir.iterdir()))}"
    cmd = train_command(
        str(REPO / "recipes" / "tiny_calc.toml"), str(run_dir), str(model),
        f"mode={mode}", f"algo.max_staleness={staleness}", "sft.steps=0", "eval.limit=0", f"learner.max_steps={steps}",
        *extra,
    )
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=3600)
    if proc.returncode:
        raise SystemExit(f"{mode} run failed:\n{proc.stderr[-3000:]}")
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    start = next(r["time"] for r in recs if r.get("loop_start"))
    steps_ = [r for r in recs if r["kind"] == "step"]
    samples = sum(r["samples"] for r in steps_)
    wall = steps_[-1]["time"] - start
    stale = sum(int(k) * v for r in steps_ for k, v in r["staleness_hist"].items()) / max(1, samples)
    util = next(r for r in recs if r["kind"] == "utilisation")
    return {
        "wall_s": wall, "samples": samples, "samples_per_s": samples / wall, "mean_staleness": stale,
        "gen_busy": util["generator_busy_fraction"], "learner_busy": util["learner_busy_fraction"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--set", dest="extra", action="append", default=[], help="extra recipe overrides")
    args = ap.parse_args()
    extra = list(args.extra)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = work / "model"
        subprocess.run([sys.executable, "-m", "agentrl.cli", "model", "init", "tiny", str(model)], check=True, cwd=REPO, capture_output=True)
        (work / "runs").mkdir()
        configs = [("sync", 0), ("async", 1), ("async", 2), ("async", 4)]
        results: dict[tuple[str, int], list[dict]] = {c: [] for c in configs}
        for _ in range(args.repeats):
            for mode, s in configs:
                results[(mode, s)].append(run_once(mode, s, args.steps, model, work / "runs", extra))
    base = statistics.median(r["wall_s"] for r in results[("sync", 0)])
    print(f"\n{args.steps} learner steps, {args.repeats} repeats (median), same recipe and seed\n")
    print("| mode | max_staleness | RL wall-clock s | samples/s | mean staleness | generator busy | learner busy | speed-up vs sync |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for (mode, s), rs in results.items():
        med = {k: statistics.median(r[k] for r in rs) for k in ("wall_s", "samples_per_s", "mean_staleness", "gen_busy", "learner_busy")}
        print(
            f"| {mode} | {s} | {med['wall_s']:.1f} | {med['samples_per_s']:.1f} | {med['mean_staleness']:.2f} | "
            f"{med['gen_busy']:.0%} | {med['learner_busy']:.0%} | {base / med['wall_s']:.2f}x |"
        )

if __name__ == "__main__":
    main()
