"""DAPO's dynamic sampling with refill against none, on the main job and on SmolLM2, same seeds.

For each task both arms start from the same SFT checkpoint, with the same seed and seeded sampling,
and differ only in ``algo.dynamic_sampling`` (``off``: every group is trained, zero-variance ones
with no gradient; ``refill``: only groups with reward variance reach a batch, the rest are set
aside and later groups fill the batch, up to ``algo.max_sampling_factor`` times its groups):

- ``main``: ``recipes/tiny_calc.toml`` from ``--tiny-sft`` (made by its SFT stage when missing),
  ``--tiny-steps`` learner steps, evaluation on 128 held-out problems every ``--tiny-eval-every``.
- ``smol``: ``recipes/smol_calc.toml``. Its SFT stage runs once (``mode = "sft"``) and both arms
  start from it; ``--smol-steps`` learner steps, evaluation every 5.

Per arm it reports held-out accuracy against RL wall-clock (the loop's time without evaluations),
learner steps, the steps whose batch had any group with signal, the groups sampled and trained and
how many of the trained ones had signal, the run's time and how the run ended (a
mastered task ends early with exit 0 under refill). The comparison at equal wall-clock takes each
arm's last evaluation within the shorter arm's RL time. One seed per arm: with 128 held-out
problems, +-4 points is noise.

    .venv/bin/python benchmarks/refill.py --write
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _measure import agentrl_train, emit, eval_curve, run_header

ROOT = Path(__file__).resolve().parent.parent
ARMS = ("off", "refill")
FAILED = "FAILED"
"""The file in an arm's run directory that says how a run that stopped with an error ended."""


def step_counts(run_dir: Path) -> dict[str, float]:
    """What the learner's steps of a run carried, from its ``metrics.jsonl``: ``steps``,
    ``with_signal`` (steps whose batch had a group with reward variance), ``groups_trained``,
    ``groups_signal`` (trained groups with variance), ``groups_sampled`` (every group generated,
    set-aside ones included) and the run's final ``status``."""
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [r for r in recs if r.get("kind") == "step"]
    out = {"steps": len(steps), "with_signal": 0, "groups_trained": 0, "groups_signal": 0, "groups_sampled": 0}
    for r in steps:
        groups = int(r.get("groups", 0))
        signal = groups - int(r.get("zero_variance_groups", 0))
        out["with_signal"] += signal > 0
        out["groups_trained"] += groups
        out["groups_signal"] += signal
        out["groups_sampled"] += int(r.get("groups_sampled", groups + int(r.get("zero_variance_groups_dropped", 0))))
    failed = run_dir / FAILED
    if failed.is_file():
        out["status"] = failed.read_text().strip()
    else:
        summary = json.loads((run_dir / "summary.json").read_text())
        out["status"] = f"early: {summary['ended_early']}" if summary.get("ended_early") else "max_steps"
    return out


def train_arm(recipe: str, run_dir: Path, overrides: list[str]) -> None:
    """Run one arm; a run that stops with an error (a degenerate run, for one) is a result too:
    its last ``agentrl: error:`` line goes into ``RUN_DIR/FAILED`` and its records are read as they are."""
    (run_dir / FAILED).unlink(missing_ok=True)
    try:
        agentrl_train(recipe, run_dir, overrides)
    except SystemExit:
        log = Path(f"{run_dir}.log").read_text().splitlines()
        said = [line for line in log if line.startswith("agentrl: error:")]
        (run_dir / FAILED).write_text(f"exit 2: {said[-1][len('agentrl: error: '):] if said else 'see ' + str(run_dir) + '.log'}\n")


def run_seconds(run_dir: Path) -> float:
    """The run's time from its first to its last record in ``metrics.jsonl`` (start-up of the
    engines to the final evaluation; set-up before the first record and shut-down left out)."""
    times = [json.loads(x)["time"] for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return max(times) - min(times)


def compare(task: str, recipe: str, out: Path, common: list[str], reuse: bool) -> list[str]:
    """Run both arms of one task (``reuse``: an arm already finished in its run directory is read,
    not run again) and return its lines of the report."""
    curves, counts, wall = {}, {}, {}
    for arm in ARMS:
        run_dir = out / f"{task}_{arm}"
        if reuse and ((run_dir / "final" / "config.json").is_file() or (run_dir / FAILED).is_file()):
            print(f"{task} / {arm}: reusing the finished run in {run_dir}", flush=True)
        else:
            print(f"{task} / {arm}: {recipe}", flush=True)
            train_arm(recipe, run_dir, [*common, f'algo.dynamic_sampling="{arm}"'])
        curves[arm], counts[arm] = eval_curve(str(run_dir)), step_counts(run_dir)
        wall[arm] = run_seconds(run_dir)
    budget = min(max(p["rl_s"] for p in c) for c in curves.values())
    lines = [f"**{task}** (`{recipe}`, {' '.join(common)})", "",
             "| arm | learner steps | steps with signal | groups sampled | groups trained (with signal) | ended | run s |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for arm in ARMS:
        n = counts[arm]
        lines.append(f"| {arm} | {n['steps']} | {n['with_signal']} | {n['groups_sampled']} | {n['groups_trained']} ({n['groups_signal']}) "
                     f"| {n['status'].split(' (')[0]} | {wall[arm]:.0f} |")
    lines += ["", "| arm | version | RL s | held-out accuracy |", "| --- | --- | --- | --- |"]
    for arm in ARMS:
        lines += [f"| {arm} | {p['version']} | {p['rl_s']:.0f} | {p['accuracy']:.3f} |" for p in curves[arm]]
    lines += ["", f"At the same RL wall-clock ({budget:.0f} s, the shorter arm's):"]
    for arm in ARMS:
        p = [q for q in curves[arm] if q["rl_s"] <= budget + 1e-6][-1]
        lines.append(f"- {arm}: {p['accuracy']:.3f} at version {p['version']} ({p['rl_s']:.0f} s), "
                     f"best {max(q['accuracy'] for q in curves[arm]):.3f}, from {curves[arm][0]['accuracy']:.3f} before RL")
    return lines + [""]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", default="main,smol", help="comma-separated: main, smol")
    ap.add_argument("--tiny-sft", default="runs/tiny_calc/sft", help="the main job's SFT checkpoint both arms start from")
    ap.add_argument("--tiny-steps", type=int, default=120)
    ap.add_argument("--tiny-eval-every", type=int, default=20)
    ap.add_argument("--smol-steps", type=int, default=20)
    ap.add_argument("--out", default="runs/bench_refill")
    ap.add_argument("--reuse", action="store_true", help="read arms (and the SmolLM2 SFT stage) already finished under --out instead of running them again")
    ap.add_argument("--write", action="store_true", help="write the results into benchmarks/RESULTS.md")
    args = ap.parse_args()
    started = time.time()
    out = ROOT / args.out
    lines = [run_header(started), "", "Same seed and seeded sampling in both arms; they differ only in `algo.dynamic_sampling`. "
             "RL s: the loop's wall-clock without evaluation time; run s: first to last record of the run's metrics.jsonl.", ""]
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if "main" in tasks:
        sft = ROOT / args.tiny_sft
        if not (sft / "config.json").is_file():
            print(f"no SFT checkpoint at {sft}: running tiny_calc's SFT stage", flush=True)
            agentrl_train("recipes/tiny_calc.toml", out / "tiny_sft", ['mode="sft"'], fresh=False)
            sft = out / "tiny_sft" / "sft"
        lines += compare("main", "recipes/tiny_calc.toml", out, [
            f'model.path="{sft}"', "sft.steps=0", f"learner.max_steps={args.tiny_steps}", f"eval.every_steps={args.tiny_eval_every}"], args.reuse)
    if "smol" in tasks:
        if not (out / "smol_sft" / "sft" / "config.json").is_file() or not args.reuse:
            print("smol: SFT stage", flush=True)
            agentrl_train("recipes/smol_calc.toml", out / "smol_sft", ['mode="sft"'], fresh=False)
        lines += compare("smol", "recipes/smol_calc.toml", out, [
            f'model.path="{out / "smol_sft" / "sft"}"', "sft.steps=0", f"learner.max_steps={args.smol_steps}"], args.reuse)
    emit("\n".join(lines), "refill", args.write, section="Dynamic sampling with refill")


if __name__ == "__main__":
    main()
