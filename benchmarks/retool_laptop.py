"""ReTool on a laptop: code-interpreter RL against text-only RL on SmolLM2-135M-Instruct, same budget.

Runs ``recipes/smol_retool.toml`` (``agentrl/MathTool-v0``: Python in the sandbox) and
``recipes/smol_math_text.toml`` (``agentrl/Math-v0``: no tool) for each seed, interleaved (seed 0
tool, seed 0 text, seed 1 tool, ...), each the whole recipe from the pretrained model: its own SFT
warm-up (the same budget, on demonstrations in its own format), then the same RL steps, episodes
per step and evaluation. Every evaluation scores the in-distribution held-out set
(``synthetic:math``, test split) and the out-of-distribution one (``eval.sets.ood``:
``synthetic:math_ood``) with ReTool's measurements of tool use.

It prints, and with ``--write`` puts in benchmarks/RESULTS.md (block ``retool_laptop``) and the
README (the same block):

- per arm (mean over seeds, with each seed's value): held-out accuracy before RL (the SFT start)
  and at the end, in and out of distribution; the tool use at the end (tool-call rate, code blocks
  per episode, code error rate, recovery rate, response tokens); the whole command's wall-clock;
- the goal's three differences: tool minus text at the end (in and out of distribution), and the
  tool arm's gain over its SFT start;
- ``docs/img/retool_laptop.png`` (with ``--write``; otherwise ``retool_laptop.png`` beside the
  runs): accuracy against RL step and against RL wall-clock (evaluation time excluded), tool
  against text, in distribution (solid) and out of it (dashed).

A run that fails is reported and the others go on (each takes about an hour); nothing is written
until every run has finished (rerun with ``--reuse`` to read the finished ones again). Each finished
run of the shipped recipes (no ``--set``) also leaves its record, the evaluation curve and the
whole command's seconds with the commit that ran it, in ``benchmarks/records/retool_laptop/``
(``ARM_sSEED.json``, a few kB): commit it, and ``--reuse`` reads it on any later machine, where the
run directory (gigabytes of checkpoints, outside git) is gone. A run directory, when present, wins.

With 96 in-distribution and 64 out-of-distribution problems per evaluation, one seed's accuracy is
noisy by about +-5 and +-6 points (one standard error near 0.5): read the seed spread beside the
means.

    flock /tmp/agentrl-heavy.lock .venv/bin/python benchmarks/retool_laptop.py --write
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from statistics import mean
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _measure import agentrl_train, emit, eval_curve, run_header, write_block

ROOT = Path(__file__).resolve().parent.parent
ARMS = {"tool": "recipes/smol_retool.toml", "text": "recipes/smol_math_text.toml"}
FIGURE = ROOT / "docs" / "img" / "retool_laptop.png"
RECORDS = ROOT / "benchmarks" / "records" / "retool_laptop"
"""One JSON record per finished run of the shipped recipes (``ARM_sSEED.json``), kept in git."""
TOOL_USE = (("tool_call_rate", "tool-call rate", "{:.2f}"), ("tool_calls_mean", "code blocks / episode", "{:.2f}"),
            ("tool_error_rate", "code error rate", "{:.2f}"), ("recovery_rate", "recovery rate", "{:.2f}"),
            ("response_tokens_mean", "response tokens", "{:.0f}"))
"""ReTool's measurements at the last evaluation (key of the evaluation record, label, format)."""


def run_arm(arm: str, seed: int, out: Path, overrides: list[str], reuse: bool) -> dict[str, Any]:
    """One run of ``arm`` with ``seed`` (``reuse``: a finished run is read, not run again, from its
    run directory or else from its record in :data:`RECORDS`): its evaluation curve, its whole
    command's seconds and where it was read from."""
    run_dir = out / f"{arm}_s{seed}"
    seconds_file = run_dir / "command_s.txt"
    record = RECORDS / f"{arm}_s{seed}.json"
    if reuse and (run_dir / "summary.json").is_file() and seconds_file.is_file():
        print(f"{arm} seed {seed}: reusing the finished run in {run_dir}", flush=True)
    elif reuse and not overrides and record.is_file():
        print(f"{arm} seed {seed}: reusing its record {record}", flush=True)
        return read_record(record)
    else:
        print(f"{arm} seed {seed}: {ARMS[arm]} -> {run_dir}", flush=True)
        seconds = agentrl_train(ARMS[arm], run_dir, [f"seed={seed}", *overrides], timeout_s=3 * 3600)
        seconds_file.write_text(f"{seconds:.1f}\n")
    result = {"curve": eval_curve(str(run_dir)), "command_s": float(seconds_file.read_text()), "run_dir": run_dir}
    if not overrides:
        write_record(record, arm, seed, result)
    return result


def write_record(path: Path, arm: str, seed: int, result: dict[str, Any]) -> None:
    """Keep ``result`` (a finished run of the shipped recipe) in ``path``, with the commit and the
    recipe that produced it, so that it outlives the run directory."""
    import subprocess

    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True, check=False).stdout.strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"arm": arm, "seed": seed, "recipe": ARMS[arm], "commit": commit,
                                "run_dir": str(result["run_dir"]), "command_s": result["command_s"],
                                "curve": result["curve"]}, indent=1) + "\n")


def read_record(path: Path) -> dict[str, Any]:
    """A run's result as :func:`run_arm` returns it, from its record (``run_dir``: where it ran)."""
    rec = json.loads(path.read_text())
    missing = [k for k in ("curve", "command_s", "run_dir") if k not in rec]
    if missing or not rec["curve"]:
        raise SystemExit(f"{path}: not a finished run's record (missing {missing or ['curve']})")
    return {"curve": rec["curve"], "command_s": float(rec["command_s"]), "run_dir": Path(rec["run_dir"])}


def _pts(value: float) -> str:
    return f"{100 * value:+.1f}"


def _across(runs: list[dict[str, Any]], pick: Any, fmt: str = "{:.3f}") -> str:
    """``mean (seed values)`` of ``pick(run)`` over ``runs``."""
    values = [pick(r) for r in runs]
    return fmt.format(mean(values)) + (" (" + ", ".join(fmt.format(v) for v in values) + ")" if len(values) > 1 else "")


def report(runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The tables and the goal's lines for the finished ``runs`` (arm -> one entry per seed)."""
    first, last = (lambda k: (lambda r: r["curve"][0].get(k, 0.0))), (lambda k: (lambda r: r["curve"][-1].get(k, 0.0)))
    lines = ["| arm | accuracy before RL (SFT start) | accuracy at the end | OOD before RL | OOD at the end | whole command s |",
             "| --- | --- | --- | --- | --- | --- |"]
    for arm, rs in runs.items():
        lines.append(f"| {arm} | {_across(rs, first('accuracy'))} | {_across(rs, last('accuracy'))} | {_across(rs, first('ood/accuracy'))} "
                     f"| {_across(rs, last('ood/accuracy'))} | {_across(rs, lambda r: r['command_s'], '{:.0f}')} |")
    lines += ["", "Tool use at the last evaluation (in distribution; mean over seeds):", "",
              "| arm | " + " | ".join(label for _, label, _ in TOOL_USE) + " |", "| --- " * (len(TOOL_USE) + 1) + "|"]
    for arm, rs in runs.items():
        lines.append(f"| {arm} | " + " | ".join(fmt.format(mean(last(k)(r) for r in rs)) for k, _, fmt in TOOL_USE) + " |")
    lines += ["", "Held-out accuracy at each evaluation (mean over seeds; RL s: the loop's wall-clock without evaluation time):", "",
              "| arm | version | RL s | accuracy | OOD accuracy | tool-call rate |", "| --- | --- | --- | --- | --- | --- |"]
    for arm, rs in runs.items():
        for i in range(min(len(r["curve"]) for r in rs)):
            pts = [r["curve"][i] for r in rs]
            lines.append(f"| {arm} | {pts[0]['version']} | {mean(p['rl_s'] for p in pts):.0f} | {mean(p['accuracy'] for p in pts):.3f} "
                         f"| {mean(p.get('ood/accuracy', 0.0) for p in pts):.3f} | {mean(p['tool_call_rate'] for p in pts):.2f} |")
    if "tool" in runs and "text" in runs:
        end = {arm: mean(last("accuracy")(r) for r in rs) for arm, rs in runs.items()}
        ood = {arm: mean(last("ood/accuracy")(r) for r in rs) for arm, rs in runs.items()}
        gain = mean(last("accuracy")(r) - first("accuracy")(r) for r in runs["tool"])
        lines += ["", "The goal (issue 38: each at least +15 points, and more out of distribution than in it):",
                  f"- tool minus text at the end, in distribution: **{_pts(end['tool'] - end['text'])} points**",
                  f"- tool minus text at the end, out of distribution: **{_pts(ood['tool'] - ood['text'])} points**",
                  f"- the tool arm's gain over its own SFT start: **{_pts(gain)} points**"]
    return lines


def figure(runs: dict[str, list[dict[str, Any]]], path: Path) -> None:
    """Accuracy against RL step and against RL wall-clock, each arm's seed mean, in and out of distribution."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    colours = {"tool": "tab:blue", "text": "tab:orange"}
    for arm, rs in runs.items():
        n = min(len(r["curve"]) for r in rs)
        for key, style, what in (("accuracy", "-", "in distribution"), ("ood/accuracy", "--", "out of distribution")):
            ys = [mean(r["curve"][i].get(key, 0.0) for r in rs) for i in range(n)]
            steps = [rs[0]["curve"][i]["version"] for i in range(n)]
            secs = [mean(r["curve"][i]["rl_s"] for r in rs) for i in range(n)]
            axes[0].plot(steps, ys, style, marker="o", color=colours.get(arm), label=f"{arm}, {what}")
            axes[1].plot(secs, ys, style, marker="o", color=colours.get(arm), label=f"{arm}, {what}")
    axes[0].set_xlabel("RL step (weight version)")
    axes[1].set_xlabel("RL wall-clock, s (evaluations excluded)")
    for ax in axes:
        ax.set_ylabel("held-out accuracy")
        ax.set_ylim(-0.02, 1.02)
        ax.legend(fontsize=8)
    seeds = min(len(rs) for rs in runs.values())
    fig.suptitle(f"SmolLM2-135M-Instruct: code-interpreter RL against text-only RL (mean of {seeds} seed(s))")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0,1", help="comma-separated recipe seeds; each arm runs once per seed")
    ap.add_argument("--arms", default="tool,text", help="comma-separated: tool, text")
    ap.add_argument("--out", default="runs/bench_retool")
    ap.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE",
                    help="a recipe override for every run (e.g. learner.max_steps=4 for a trial); "
                         "results with overrides are never written")
    ap.add_argument("--reuse", action="store_true", help="read runs already finished under --out instead of running them again")
    ap.add_argument("--write", action="store_true", help="write the results into benchmarks/RESULTS.md and README.md")
    args = ap.parse_args()
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        ap.error(f"--arms: unknown arm(s) {unknown}; choose from {sorted(ARMS)}")
    if args.write and args.overrides:
        ap.error("--write takes the shipped recipes as they are: drop --set")
    started = time.time()
    out = ROOT / args.out
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
    failed: list[str] = []
    for seed in (int(s) for s in args.seeds.split(",") if s.strip()):
        for arm in arms:
            try:
                runs[arm].append(run_arm(arm, seed, out, args.overrides, args.reuse))
            except SystemExit as exc:  # one run's failure does not throw away the others (hours each)
                failed.append(f"{arm} seed {seed}: {exc}")
                print(f"{arm} seed {seed} FAILED: {exc}", flush=True)
    if failed:
        raise SystemExit("not written: these runs failed (the others are kept under "
                         f"{out}; rerun with --reuse once they are fixed):\n  " + "\n  ".join(failed))
    figure_path = FIGURE if args.write else out / FIGURE.name  # the docs' figure only with --write
    figure(runs, figure_path)
    shown = figure_path.relative_to(ROOT) if figure_path.is_relative_to(ROOT) else figure_path
    lines = [run_header(started), "",
             f"Each run is the whole recipe from the pretrained model (SFT warm-up, then RL); seeds {args.seeds}, run "
             f"interleaved; runs in `{args.out}`{' with ' + ' '.join(args.overrides) if args.overrides else ''}. "
             f"Figure: `{shown}`.", "", *report(runs)]
    text = "\n".join(lines)
    emit(text, "retool_laptop", args.write, section="ReTool on a laptop")
    if args.write:
        write_block("retool_laptop", text, path=str(ROOT / "README.md"), section="ReTool on a laptop")
        print("written to the 'retool_laptop' block of README.md")
    print(f"figure: {figure_path}")
    for arm, rs in runs.items():
        for r in rs:
            print(f"{arm}: {r['run_dir']} (report: .venv/bin/agentrl report {r['run_dir']})")


if __name__ == "__main__":
    main()
