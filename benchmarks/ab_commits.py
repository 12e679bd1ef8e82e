"""The same run on two commits, measured the same day: a before/after A/B of a change.

Each commit is checked out as a git worktree (``--worktrees``, default ``/tmp/agentrl-ab``), with
this checkout's ``.venv`` and ``runs/models`` linked in and ``PYTHONPATH`` set to the worktree, so
that each run imports its own commit's code. ``agentrl train RECIPE`` runs ``--repeats`` times per
commit, interleaved (a, b, a, b, ...: the machine's drift falls on both), with the same
overrides (``--set``). Per run, from its ``metrics.jsonl``:

- RL loop seconds (the loop's start to its last step) and samples per second over it;
- the medians over its steps (the first step, which warms up, left out) of where a step went:
  the learner's forward/backward (``step_forward_backward_s``), its whole step (``train_s``), its
  busy time with publishing (``learner_busy_s``), the generators' sleep (``generator_sleep_s``),
  publishing (``publish_s``) and the generators' update stall (``update_stall_s``);
- the whole command's wall-clock.

And the outcome, run against run (repeat ``i`` of one commit against repeat ``i`` of the other):
the SFT losses step by step (how many records are equal bit for bit, and the largest difference),
the RL losses step by step (the same), and the held-out accuracy and mean reward at each
evaluation. A change that is structure only gives the same numbers.

It prints each run and the medians per commit with the ratio after/before (and the per-repeat
paired ratios of samples/s), and with ``--write`` puts them in benchmarks/RESULTS.md under
``--key`` (section ``--section``). ``--reuse`` reads runs already finished under ``--out`` (named
``LABEL_REPEAT``) instead of running them again.

    flock /tmp/agentrl-heavy.lock .venv/bin/python benchmarks/ab_commits.py 14d6b7f 91a1eec \\
        --labels before after --recipe recipes/tiny_calc.toml --repeats 2 \\
        --set model.path='"runs/tiny_calc/sft"' --set sft.steps=0 --set learner.max_steps=30 --set eval.limit=0
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from statistics import median
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _measure import emit, run_header

ROOT = Path(__file__).resolve().parent.parent
STEP_KEYS = (("step_forward_backward_s", "forward/backward"), ("train_s", "learner step"), ("learner_busy_s", "learner busy"),
             ("generator_sleep_s", "generator sleep"), ("publish_s", "publish"), ("update_stall_s", "update stall"))
"""Per-step fields reported (median over a run's steps after the first), and their labels."""


def worktree(rev: str, root: Path) -> Path:
    """A worktree of this repository at ``rev`` under ``root`` (made once, reused), with the
    checkout's ``.venv`` and ``runs/models`` linked in."""
    sha = subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    path = root / sha
    if not path.is_dir():
        root.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "worktree", "add", "--detach", str(path), sha], cwd=ROOT, check=True, capture_output=True)
    (path / "runs").mkdir(exist_ok=True)
    for link, target in ((path / ".venv", ROOT / ".venv"), (path / "runs" / "models", ROOT / "runs" / "models")):
        if not link.exists():
            link.symlink_to(target)
    return path


def run_once(tree: Path, recipe: str, run_dir: Path, overrides: list[str], timeout_s: float) -> float:
    """``agentrl train recipe`` in ``tree`` (its own code on ``PYTHONPATH``) into ``run_dir``;
    the whole command's seconds. Raises ``SystemExit`` naming the log when it fails."""
    cmd = [str(tree / ".venv" / "bin" / "agentrl"), "train", recipe, "--set", f'run_dir="{run_dir}"']
    for o in overrides:
        cmd += ["--set", o]
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    if run_dir.exists():  # this benchmark's own run being made again (no --fresh: older commits' CLIs lack it)
        shutil.rmtree(run_dir)
    t0 = time.monotonic()
    with open(f"{run_dir}.log", "w") as log:
        rc = subprocess.run(cmd, cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, stdout=log, stderr=subprocess.STDOUT,
                            timeout=timeout_s, check=False).returncode
    if rc:
        raise SystemExit(f"{' '.join(cmd)} failed ({rc}) in {tree}; see {run_dir}.log")
    seconds = time.monotonic() - t0
    Path(f"{run_dir}.command_s").write_text(f"{seconds:.1f}\n")
    return seconds


def run_stats(run_dir: Path, samples_per_step: int) -> dict[str, float]:
    """What one finished run measured (see the module docstring)."""
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in recs if r.get("kind") == "step"]
    start = next(r["time"] for r in recs if r.get("loop_start"))
    if not steps:
        raise SystemExit(f"{run_dir}: no step was logged")
    loop_s = steps[-1]["time"] - start
    later = steps[1:] or steps
    out = {"steps": float(len(steps)), "loop_s": loop_s, "samples_per_s": samples_per_step * len(steps) / loop_s}
    out.update({key: median(s.get(key, 0.0) for s in later) for key, _ in STEP_KEYS})
    command = Path(f"{run_dir}.command_s")
    if command.is_file():
        out["command_s"] = float(command.read_text())
    return out


def records(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    """The ``metrics.jsonl`` records of ``kind`` (``sft``, ``step``, ``eval``) of a finished run."""
    return [r for r in (json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip())
            if r.get("kind") == kind]


def same_numbers(a: list[float], b: list[float]) -> str:
    """How two runs' series of one number compare: equal bit for bit, or how many are and the
    largest difference."""
    if not a and not b:
        return "none logged"
    if len(a) != len(b):
        return f"{len(a)} against {len(b)} records"
    equal = sum(x == y for x, y in zip(a, b))
    if equal == len(a):
        return f"all {len(a)} equal bit for bit"
    return f"{equal} of {len(a)} equal bit for bit; largest difference {max(abs(x - y) for x, y in zip(a, b)):.2e}"


def outcome(dirs: dict[str, list[Path]], labels: tuple[str, str]) -> list[str]:
    """The runs' outcomes side by side, repeat against repeat (see the module docstring), as
    markdown lines."""
    a, b = labels
    lines = [f"| repeat | SFT losses, {b} against {a} | RL losses, {b} against {a} | held-out accuracy {a} | "
             f"held-out accuracy {b} | mean reward {a} | mean reward {b} |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for rep, (da, db) in enumerate(zip(dirs[a], dirs[b]), 1):
        sft = same_numbers([r["sft_loss"] for r in records(da, "sft")], [r["sft_loss"] for r in records(db, "sft")])
        rl = same_numbers([r.get("loss", 0.0) for r in records(da, "step")], [r.get("loss", 0.0) for r in records(db, "step")])
        ea, eb = records(da, "eval"), records(db, "eval")
        acc = ["/".join(f"{e['accuracy']:.3f}" for e in evals) or "-" for evals in (ea, eb)]
        reward = ["/".join(f"{e['reward_mean']:.3f}" for e in evals) or "-" for evals in (ea, eb)]
        lines.append(f"| {rep} | {sft} | {rl} | {acc[0]} | {acc[1]} | {reward[0]} | {reward[1]} |")
    return lines


def compare(runs: dict[str, list[dict[str, float]]], labels: tuple[str, str]) -> list[str]:
    """The medians per commit and the after/before ratios, as markdown lines."""
    a, b = labels
    keys = [("samples_per_s", "samples/s"), ("loop_s", "RL loop s"), *STEP_KEYS, ("command_s", "whole command s")]
    lines = [f"| | {a} (median) | {b} (median) | {b} / {a} |", "| --- | ---: | ---: | ---: |"]
    for key, label in keys:
        va = [r[key] for r in runs[a] if key in r]
        vb = [r[key] for r in runs[b] if key in r]
        if not va or not vb:
            continue
        ma, mb = median(va), median(vb)
        lines.append(f"| {label} | {ma:.3f} | {mb:.3f} | {mb / ma:.2f}x |" if ma else f"| {label} | {ma:.3f} | {mb:.3f} | - |")
    paired = [rb["samples_per_s"] / ra["samples_per_s"] for ra, rb in zip(runs[a], runs[b])]
    lines += ["", f"samples/s, {b} over {a}, per repeat (paired in order): " + ", ".join(f"{p:.2f}x" for p in paired)
              + f"; median {median(paired):.2f}x"]
    return lines


def add_run_arguments(ap: argparse.ArgumentParser, *, out: str, timeout_s: float, key: str) -> None:
    """The arguments of a script that runs commits' runs in worktrees (this one and
    bisect_outcome.py): where runs and worktrees go, a run's time limit, reading finished runs
    again, and the RESULTS.md block written."""
    ap.add_argument("--out", default=out)
    ap.add_argument("--worktrees", default="/tmp/agentrl-ab")
    ap.add_argument("--timeout-s", type=float, default=timeout_s)
    ap.add_argument("--reuse", action="store_true", help="read runs already finished under --out")
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--key", default=key)
    ap.add_argument("--section", default="Before and after, the same day")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("revs", nargs=2, metavar="REV", help="the two commits: before, after")
    ap.add_argument("--labels", nargs=2, default=("before", "after"))
    ap.add_argument("--recipe", default="recipes/tiny_calc.toml")
    ap.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE")
    ap.add_argument("--set-after", action="append", default=[], dest="after_overrides", metavar="KEY=VALUE",
                    help="overrides for the after commit only (a key the before commit does not know, set to "
                         "what that commit did: e.g. placement.mode=\"separate\" against a commit before [placement])")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--samples-per-step", type=int, default=None, help="default: the recipe's learner.batch_size")
    add_run_arguments(ap, out="/tmp/agentrl-ab/runs", timeout_s=3600, key="ab_commits")
    args = ap.parse_args()
    started = time.time()
    labels = tuple(args.labels)
    out = Path(args.out)
    samples = args.samples_per_step
    if samples is None:
        from agentrl.config import load_recipe

        samples = load_recipe(ROOT / args.recipe, list(args.overrides)).learner.batch_size
    trees = {label: None if args.reuse else worktree(rev, Path(args.worktrees)) for label, rev in zip(labels, args.revs)}
    runs: dict[str, list[dict[str, float]]] = {label: [] for label in labels}
    dirs: dict[str, list[Path]] = {label: [] for label in labels}
    for rep in range(1, args.repeats + 1):
        for label in labels:
            run_dir = out / f"{label}_{rep}"
            if not (args.reuse and (run_dir / "metrics.jsonl").is_file()):
                extra = args.after_overrides if label == labels[1] else []
                run_once(trees[label] or worktree(args.revs[labels.index(label)], Path(args.worktrees)), args.recipe, run_dir,
                         [*args.overrides, *extra], args.timeout_s)
            stats = run_stats(run_dir, samples)
            dirs[label].append(run_dir)
            runs[label].append(stats)
            print(f"{label} {rep}: " + ", ".join(f"{k} {v:.3f}" for k, v in stats.items()), flush=True)
    lines = [run_header(started), "",
             f"`{args.recipe}` with {' '.join('`' + o + '`' for o in args.overrides) or 'no overrides'}"
             + (f" ({labels[1]} also {' '.join('`' + o + '`' for o in args.after_overrides)})" if args.after_overrides else "")
             + f"; {labels[0]} = "
             f"{args.revs[0]}, {labels[1]} = {args.revs[1]}; {args.repeats} repeats each, interleaved; step times are "
             f"medians over each run's steps after the first, then the median over runs.", "", *compare(runs, labels),
             "", "The outcome, repeat against repeat (evaluations in order):", "", *outcome(dirs, labels)]
    emit("\n".join(lines), args.key, args.write, section=args.section)


if __name__ == "__main__":
    main()
