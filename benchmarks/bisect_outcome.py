"""The first commit whose run trains different numbers: a bisection over a deterministic run.

Two commits give different outcomes on the same run (``ab_commits.py``). With many commits between
them, this finds the first one that changed what the run trains. It needs a run that is
deterministic on one commit: ``mode = "sync"`` (sampling is seeded per episode and turn, and the
learner trains each step's batch once the batch is whole), best from a fixed model without SFT
(``--set model.path=... --set sft.steps=0``). Each commit's run is compared with the first
commit's by its RL losses step by step: bit for bit, or within ``--atol``.

It runs the first commit twice (the run must repeat itself bit for bit, or the bisection would
mean nothing), the last commit once (it must differ, or there is nothing to find), then halves the
first-parent range between them. A commit whose run fails (an intermediate state that does not
start) is stepped over, to its neighbour, as ``git bisect skip`` would. ``--set-where`` gives a
key only to commits that know it (a recipe section added in the range: ``placement.mode`` against
commits before ``[placement]``), by a file that exists from the commit that added the key on.

    flock /tmp/agentrl-heavy.lock .venv/bin/python benchmarks/bisect_outcome.py 3fd1106 9413e32 \\
        --set mode='"sync"' --set model.path='"runs/tiny_calc/sft"' --set sft.steps=0 \\
        --set learner.max_steps=6 --set eval.limit=0 \\
        --set-where 'agentrl/placement_plan.py:placement.mode="separate"'
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _measure import emit, run_header
from ab_commits import ROOT, add_run_arguments, records, run_once, same_numbers, worktree


def first_parent_range(good: str, bad: str) -> list[str]:
    """The commits from ``good`` to ``bad`` along first parents, oldest first, both ends included."""
    out = subprocess.run(["git", "rev-list", "--first-parent", "--reverse", f"{good}..{bad}"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.split()
    first = subprocess.run(["git", "rev-parse", good], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    return [first, *out]


def overrides_for(tree: Path, overrides: list[str], where: list[str]) -> list[str]:
    """``overrides`` plus each ``PATH:KEY=VALUE`` of ``where`` whose ``PATH`` exists in ``tree``."""
    extra = []
    for item in where:
        path, _, setting = item.partition(":")
        if not setting:
            raise SystemExit(f"--set-where {item!r}: expected PATH:KEY=VALUE")
        if (tree / path).exists():
            extra.append(setting)
    return [*overrides, *extra]


def rl_losses(run_dir: Path) -> list[float]:
    """The RL loss of every step of a finished run, in order."""
    return [r.get("loss", 0.0) for r in records(run_dir, "step")]


def agree(a: list[float], b: list[float], atol: float) -> bool:
    """The two runs' losses are the same: as many steps, each within ``atol`` (0: bit for bit)."""
    return len(a) == len(b) and all(abs(x - y) <= atol for x, y in zip(a, b))


def subject(rev: str) -> str:
    """``rev``'s short hash and the first 100 characters of its message's first line."""
    return subprocess.run(["git", "log", "-1", "--format=%h %s", rev], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()[:110]


class Bisection:
    """Runs commits (each once, cached) and says whether each trains what the first commit trains."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out)
        self.reference: list[float] | None = None
        self.seen: dict[str, str] = {}
        """Per commit: ``same``, ``differs`` or ``failed``."""
        self.log: list[str] = []

    def run(self, rev: str, tag: str = "") -> list[float] | None:
        """The RL losses of ``rev``'s run (None: it failed)."""
        tree = worktree(rev, Path(self.args.worktrees))
        run_dir = self.out / f"{rev[:7]}{tag}"
        if not (self.args.reuse and (run_dir / "metrics.jsonl").is_file()):
            try:
                run_once(tree, self.args.recipe, run_dir, overrides_for(tree, self.args.overrides, self.args.where),
                         self.args.timeout_s)
            except (SystemExit, subprocess.TimeoutExpired) as exc:
                print(f"{rev[:7]}: the run failed ({exc})", flush=True)
                return None
        return rl_losses(run_dir)

    def verdict(self, rev: str) -> str:
        if rev not in self.seen:
            losses = self.run(rev)
            if losses is None:
                self.seen[rev] = "failed"
            else:
                assert self.reference is not None
                self.seen[rev] = "same" if agree(self.reference, losses, self.args.atol) else "differs"
                self.log.append(f"| {subject(rev)} | {same_numbers(self.reference, losses)} |")
            print(f"{subject(rev)}: {self.seen[rev]}", flush=True)
        return self.seen[rev]


def bisect(commits: list[str], verdict) -> tuple[int, list[int]]:
    """Index of the first commit of ``commits`` whose verdict is ``differs``, given that the first
    is ``same`` and the last ``differs``; and the indices stepped over (``failed``). A failed
    midpoint is replaced by its nearest untested neighbour inside the open interval; when none is
    left the first ``differs`` found is returned (the failed ones before it are listed)."""
    lo, hi = 0, len(commits) - 1
    skipped: list[int] = []
    while hi - lo > 1:
        mid = (lo + hi) // 2
        order = sorted(range(lo + 1, hi), key=lambda i: (abs(i - mid), i))
        for i in order:
            v = verdict(commits[i])
            if v == "failed":
                skipped.append(i)
                continue
            if v == "same":
                lo = i
            else:
                hi = i
            break
        else:
            break
    return hi, sorted(i for i in skipped if lo < i < hi)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("revs", nargs=2, metavar="REV", help="the commit that trains the reference numbers, then one that does not")
    ap.add_argument("--recipe", default="recipes/tiny_calc.toml")
    ap.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE")
    ap.add_argument("--set-where", action="append", default=[], dest="where", metavar="PATH:KEY=VALUE",
                    help="KEY=VALUE only for commits in which PATH exists")
    ap.add_argument("--atol", type=float, default=0.0,
                    help="largest loss difference still counted the same (0: bit for bit; float sums taken in another "
                         "order differ in the 8th digit)")
    add_run_arguments(ap, out="/tmp/agentrl-bisect/runs", timeout_s=1800, key="bisect_outcome")
    args = ap.parse_args()
    started = time.time()
    commits = first_parent_range(*args.revs)
    b = Bisection(args)
    b.reference = b.run(commits[0])
    again = b.run(commits[0], "_again")
    if b.reference is None or again is None:
        raise SystemExit(f"{commits[0][:7]}'s run failed: nothing to bisect against")
    head = [run_header(started), "",
            f"`{args.recipe}` with {' '.join('`' + o + '`' for o in args.overrides)}"
            + (f", and where the file exists {' '.join('`' + w + '`' for w in args.where)}" if args.where else "")
            + (f"; losses within {args.atol:g} count as the same" if args.atol else "; losses compared bit for bit")
            + f"; {len(commits) - 2} commits between {commits[0][:7]} and {commits[-1][:7]} (first parents).", "",
            f"{commits[0][:7]} run twice: RL losses {same_numbers(b.reference, again)}."]
    if not agree(b.reference, again, args.atol):
        emit("\n".join([*head, "", "The run does not repeat itself: no bisection (make it deterministic: mode = \"sync\")."]),
             args.key, args.write, section=args.section)
        raise SystemExit(1)
    b.seen[commits[0]] = "same"
    last = b.verdict(commits[-1])
    if last != "differs":
        emit("\n".join([*head, "", "| commit | RL losses against the first commit's |", "| --- | --- |", *b.log, "",
                         f"{commits[-1][:7]} trains the same numbers ({last}): nothing changed them in the range."]),
             args.key, args.write, section=args.section)
        return
    first, skipped = bisect(commits, b.verdict)
    lines = [*head, "", "| commit | RL losses against the first commit's |", "| --- | --- |", *b.log, "",
             f"First commit whose run trains different numbers: **{subject(commits[first])}**"
             + (f" (or one of the {len(skipped)} before it whose run failed: {', '.join(commits[i][:7] for i in skipped)})"
                if skipped else "") + "."]
    emit("\n".join(lines), args.key, args.write, section=args.section)


if __name__ == "__main__":
    main()
