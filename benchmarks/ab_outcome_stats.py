"""Whether two commits' runs differ in outcome beyond their run-to-run spread: a permutation test
and a sign test over the finished runs of :mod:`benchmarks.ab_commits` (``LABEL_REPEAT`` folders
holding ``metrics.jsonl``).

Two outcomes per run:
- the held-out accuracy of the ``eval`` record at ``--version``;
- the mean over the run's steps of the training reward (``reward_mean`` of each ``step`` record).

For each: the values per run, the medians and means, the difference of the means (first label
minus second), the one-sided permutation p (over every way to split the runs into two groups of
the same sizes: the share with a difference of means at least the observed one) and, for runs
paired by repeat, how many pairs have the first label above the second, with the one-sided sign
test's p.

    .venv/bin/python benchmarks/ab_outcome_stats.py benchmarks/records/ab_wings --labels before after
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from math import comb
from pathlib import Path


def outcomes(run_dir: Path, version: int) -> tuple[float | None, float | None]:
    """``(held-out accuracy at version, mean training reward over the steps)`` of one run (None
    where its records lack one)."""
    accuracy, rewards = None, []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        if record.get("kind") == "eval" and record.get("version") == version:
            accuracy = float(record["accuracy"])
        elif record.get("kind") == "step" and record.get("reward_mean") is not None:
            rewards.append(float(record["reward_mean"]))
    return accuracy, (statistics.mean(rewards) if rewards else None)


def permutation_p(a: list[float], b: list[float]) -> float:
    """One-sided: the share of the splits of ``a + b`` into groups of ``len(a)`` and ``len(b)``
    whose difference of means is at least ``mean(a) - mean(b)``."""
    observed = statistics.mean(a) - statistics.mean(b)
    pool, n = a + b, len(a)
    hits = total = 0
    for chosen in itertools.combinations(range(len(pool)), n):
        rest = [pool[i] for i in range(len(pool)) if i not in chosen]
        total += 1
        hits += statistics.mean(pool[i] for i in chosen) - statistics.mean(rest) >= observed - 1e-12
    return hits / total


def sign_p(wins: int, pairs: int) -> float:
    """One-sided sign test: the chance of at least ``wins`` of ``pairs`` under a fair coin."""
    return sum(comb(pairs, k) for k in range(wins, pairs + 1)) / 2**pairs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", help="the folder holding LABEL_REPEAT run folders")
    ap.add_argument("--labels", nargs=2, default=["before", "after"])
    ap.add_argument("--version", type=int, default=120, help="the evaluation whose held-out accuracy counts")
    args = ap.parse_args(argv)
    root = Path(args.runs)
    first, second = args.labels
    repeats = sorted(int(p.name.rsplit("_", 1)[1]) for p in root.glob(f"{first}_*") if (p / "metrics.jsonl").is_file())
    pairs = [r for r in repeats if (root / f"{second}_{r}" / "metrics.jsonl").is_file()]
    values = {label: [outcomes(root / f"{label}_{r}", args.version) for r in pairs] for label in args.labels}
    print(f"{len(pairs)} repeats paired: {pairs}")
    for index, name in ((0, f"held-out accuracy at version {args.version}"), (1, "mean training reward")):
        a = [v[index] for v in values[first]]
        b = [v[index] for v in values[second]]
        if any(x is None for x in a + b):
            print(f"{name}: missing in some runs")
            continue
        wins = sum(x > y for x, y in zip(a, b))
        print(f"{name}:")
        print(f"  {first}: {', '.join(f'{x:.3f}' for x in a)} (median {statistics.median(a):.3f}, mean {statistics.mean(a):.3f})")
        print(f"  {second}: {', '.join(f'{x:.3f}' for x in b)} (median {statistics.median(b):.3f}, mean {statistics.mean(b):.3f})")
        print(f"  difference of means {statistics.mean(a) - statistics.mean(b):+.3f}; permutation p = {permutation_p(a, b):.3f} "
              f"(one-sided); {first} above {second} in {wins} of {len(pairs)} pairs, sign test p = {sign_p(wins, len(pairs)):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
