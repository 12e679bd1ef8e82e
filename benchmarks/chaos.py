"""Chaos: `agentrl train` on the tiny main job while its components are SIGKILLed from outside on
a seeded random schedule, each run judged from its append-only audit logs only.

Each run starts RL from the main job's SFT checkpoint (``--sft``; made once by
``recipes/tiny_calc.toml``'s own SFT stage when missing, then reused), with checkpoints every 2
steps, no evaluation, ``--steps`` learner steps of ``--batch`` samples. Its faults
(``--faults`` per run, one pair of them sent at once) are drawn from a generator, a generator as
a new weight version is published to it, learner rank 0, the rollout worker and a warm sandbox
worker; every ``--ppo-every``-th run is PPO (``algo.advantage = "gae"``) and may lose critic
rank 0 too. Faults and checks: ``tests/e2e/chaos.py``, shared with the default suite's short
chaos run.

A run *finished* when it exited 0 and kept every invariant, read from ``RUN_DIR/audit/``:
the final weights were trained on steps 1..max_steps; no sample trained twice, no prompt in two
steps; every trained sample from an episode a rollout worker recorded as finished; every prompt
below the cursor trained once or accounted for (dropped as stale, abandoned after infrastructure
failures, still waiting within the staleness window).

    .venv/bin/python benchmarks/chaos.py --runs 20 --write
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _measure import agentrl_train, emit, run_header  # noqa: E402

from agentrl.cli import train_command  # noqa: E402
from tests.e2e.chaos import KINDS, RESTART_METRIC, ChaosResult, describe, run_with_faults, schedule  # noqa: E402

GROUP, STALENESS = 4, 1  # tiny_calc's rollout.group_size and algo.max_staleness
GRPO_KINDS = ("generator", "generator-load", "learner", "rollout-worker", "sandbox-worker")
PPO = ('algo.advantage="gae"', "critic.warmup_steps=1", "critic.lr=1e-3")  # as the PPO e2e; step 1 trains the critic only


def overrides(steps: int, batch: int, ppo: bool) -> list[str]:
    """The ``--set`` items of one chaos run (beside its run dir and model)."""
    out = [
        "sft.steps=0", "eval.limit=0", f"learner.max_steps={steps}", f"learner.batch_size={batch}",
        "checkpoint.every_steps=2", "learner.max_degenerate_steps=0",
        # every fault of a run may hit the same kind: bounds above what a run can spend
        "learner.max_restarts=8", "rollout.max_restarts=8",
    ]
    return out + list(PPO) if ppo else out


def sft_checkpoint(path: Path) -> Path:
    """The main job's SFT checkpoint at ``path``; made by its SFT stage (``mode = "sft"``) when missing."""
    if (path / "config.json").is_file():
        return path
    print(f"no SFT checkpoint at {path}: running tiny_calc's SFT stage once", flush=True)
    agentrl_train("recipes/tiny_calc.toml", path.parent / "sft_run", ['mode="sft"'], fresh=False)
    shutil.copytree(path.parent / "sft_run" / "sft", path)
    return path


def table(results: list[ChaosResult], ppo_runs: set[int]) -> list[str]:
    """The per-run table and the per-kind totals, as markdown lines."""
    lines = ["| run | seed | algo | faults (kind@step; `+`: at once) | exit | steps | replacements | invariants | s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(results):
        reps = ", ".join(f"{k.removesuffix('_restarts')} {v}" for k, v in sorted(r.restarts.items()) if v) or "none"
        inv = "held" if not r.violations else "; ".join(r.violations)
        exit_ = str(r.rc) if r.rc is not None else "stopped"
        lines.append(f"| {i} | {r.seed} | {'PPO' if i in ppo_runs else 'GRPO'} | {describe(r.faults)} | {exit_} | "
                     f"{r.steps} | {reps} | {inv} | {r.wall_s:.0f} |")
    injected: Counter[str] = Counter()
    survived: Counter[str] = Counter()
    for r in results:
        for f in r.faults:
            if f.pid is not None:
                injected[f.kind] += 1
                survived[f.kind] += r.finished
    lines += ["", "| fault | what is killed | injected | survived (run finished, invariants held) |", "|---|---|---|---|"]
    for kind in KINDS:
        if injected[kind]:
            lines.append(f"| {kind} | {KINDS[kind]} | {injected[kind]} | {survived[kind]} |")
    return lines


def _utc_deadline(hhmm: str) -> float:
    """The next moment (Unix time) the UTC clock reads ``hhmm``."""
    import datetime as dt

    h, m = (int(x) for x in hhmm.split(":"))
    now = dt.datetime.now(dt.timezone.utc)
    at = now.replace(hour=h, minute=m, second=0, microsecond=0)
    return (at if at > now else at + dt.timedelta(days=1)).timestamp()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--faults", type=int, default=3, help="faults per run (one pair of them at once)")
    ap.add_argument("--steps", type=int, default=6, help="learner steps per run")
    ap.add_argument("--batch", type=int, default=8, help="samples per learner step")
    ap.add_argument("--ppo-every", type=int, default=4, help="every N-th run is PPO and may lose its critic (0: none)")
    ap.add_argument("--seed", type=int, default=0, help="run i uses seed SEED + i")
    ap.add_argument("--sft", default="runs/chaos/sft", help="the main job's SFT checkpoint RL starts from (made when missing)")
    ap.add_argument("--out", default="runs/chaos")
    ap.add_argument("--run-timeout", type=float, default=400, help="seconds before a run is stopped")
    ap.add_argument("--finish-by", default=None, metavar="HH:MM",
                    help="UTC time by which the benchmark must be done: no run starts unless the mean run so far fits before it")
    ap.add_argument("--write", action="store_true", help="write the results into benchmarks/RESULTS.md")
    args = ap.parse_args()
    started = time.time()
    out = ROOT / args.out
    sft = sft_checkpoint(ROOT / args.sft)
    results: list[ChaosResult] = []
    ppo_runs: set[int] = set()
    finish_by = _utc_deadline(args.finish_by) if args.finish_by else None
    for i in range(args.runs):
        if finish_by is not None and results:
            mean = sum(r.wall_s for r in results) / len(results)
            if time.time() + mean > finish_by:
                print(f"stopping after {len(results)} runs: another ({mean:.0f} s on average) would end after {args.finish_by} UTC", flush=True)
                break
        seed = args.seed + i
        ppo = args.ppo_every > 0 and i % args.ppo_every == args.ppo_every - 1
        if ppo:
            ppo_runs.add(i)
        kinds = GRPO_KINDS + (("critic",) if ppo else ())
        faults = schedule(seed, faults=args.faults, max_steps=args.steps, kinds=kinds)
        run_dir = out / f"run_{i:02d}"
        shutil.rmtree(run_dir, ignore_errors=True)
        cmd = [*train_command(str(ROOT / "recipes" / "tiny_calc.toml"), str(run_dir), str(sft),
                              *overrides(args.steps, args.batch, ppo), f"seed={seed}"), "--fresh"]
        r = run_with_faults(cmd, run_dir, out / f"run_{i:02d}.log", faults, seed=seed, max_steps=args.steps, group=GROUP,
                            staleness=STALENESS, batch=args.batch, warmup_steps=1 if ppo else 0, timeout_s=args.run_timeout)
        results.append(r)
        verdict = "finished" if r.finished else "FAILED: " + "; ".join(r.violations)
        print(f"run {i:2d} seed {seed} {'PPO ' if ppo else ''}{describe(r.faults)}: {verdict} ({r.wall_s:.0f} s)", flush=True)
        for f in r.faults:
            if f.note:
                print(f"    {f.kind}@{f.at_step}: {f.note}", flush=True)
    finished = sum(r.finished for r in results)
    violations = [f"run {i}: {v}" for i, r in enumerate(results) for v in r.violations]
    sent = sum(f.pid is not None for r in results for f in r.faults)
    loads = [f for r in results for f in r.faults if f.kind == "generator-load" and f.pid is not None]
    load_hits = sum(min(r.load_failures, 1) for r in results if any(f.kind == "generator-load" and f.pid is not None for f in r.faults))
    lines = [
        run_header(started), "",
        f"{len(results)} runs (of {args.runs} asked) of the tiny main job from its SFT checkpoint ({args.steps} learner steps of {args.batch} samples, "
        f"checkpoints every 2 steps, no evaluation; every {args.ppo_every}th run PPO), {args.faults} SIGKILLs per run "
        f"(one pair at once), {sent} sent in all. **{finished} of {len(results)} runs finished** (exit 0, max_steps reached, "
        f"every audit invariant held). Invariants violated: {'none' if not violations else len(violations)}.",
        "",
        *table(results, ppo_runs),
        "",
        f"generator-load: {len(loads)} kills as a new version was published; in {load_hits} of those runs the fleet said "
        "a generator failed to load the version (the kill landed during the load), in the others it died just before or after it.",
    ]
    lines += ["", "Violations:", *[f"- {v}" for v in violations]] if violations else []
    emit("\n".join(lines), "chaos", args.write, section="Chaos")
    sys.exit(0 if finished == len(results) else 1)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 - said in one line, not as a traceback
        print(f"chaos: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(2)
