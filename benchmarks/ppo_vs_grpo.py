"""PPO with a learned critic (GAE) against GRPO on the tiny calculator task, in the same wall-clock.

Both runs start from the same SFT checkpoint (``--sft``; made with ``recipes/tiny_calc.toml``'s SFT
stage when missing), run ``agentrl train`` on ``recipes/tiny_calc.toml`` (GRPO, groups of 4) and
``recipes/tiny_calc_ppo.toml`` (PPO-GAE, groups of 1, a critic rank beside the learner) with the
same number of samples per step, and evaluate on the same 128 held-out problems every
``--eval-every`` steps. The RL wall-clock of an evaluation is the time since the loop's start
minus the time spent in evaluations before it. The comparison at equal wall-clock takes, for each
run, its last evaluation within the budget (the shorter run's total RL time). One seed per run:
with 128 problems, +-4 points is noise.

    .venv/bin/python benchmarks/ppo_vs_grpo.py --steps 120 --eval-every 20 --write
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _measure import agentrl_train, emit, eval_curve, run_header

ROOT = Path(__file__).resolve().parent.parent
RUNS = {"grpo": "recipes/tiny_calc.toml", "ppo-gae": "recipes/tiny_calc_ppo.toml"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=120, help="learner steps per run")
    ap.add_argument("--eval-every", type=int, default=20)
    ap.add_argument("--sft", default="runs/tiny_calc/sft", help="the SFT checkpoint both runs start from")
    ap.add_argument("--out", default="runs/bench_ppo_vs_grpo")
    ap.add_argument("--write", action="store_true", help="write the results into benchmarks/RESULTS.md")
    args = ap.parse_args()
    started = time.time()
    out = ROOT / args.out
    sft = ROOT / args.sft
    if not (sft / "config.json").is_file():
        print(f"no SFT checkpoint at {sft}: running tiny_calc's SFT stage")
        agentrl_train(RUNS["grpo"], out / "sft_run", ['mode="sft"'], fresh=False)
        sft = out / "sft_run" / "sft"
    common = [f'model.path="{sft}"', "sft.steps=0", f"learner.max_steps={args.steps}", f"eval.every_steps={args.eval_every}"]
    curves, wall = {}, {}
    for name, recipe in RUNS.items():
        print(f"{name}: {recipe}", flush=True)
        wall[name] = agentrl_train(recipe, out / name, common)
        curves[name] = eval_curve(str(out / name))
    budget = min(max(p["rl_s"] for p in c) for c in curves.values())
    lines = [run_header(started), "",
             f"Both from the SFT checkpoint `{args.sft}`, {args.steps} learner steps of 32 samples, evaluation on 128 held-out "
             f"problems (temperature 1.0) every {args.eval_every} steps. RL s: loop wall-clock without evaluation time.", "",
             "| run | version | RL s | held-out accuracy | tool-call rate |", "| --- | --- | --- | --- | --- |"]
    for name, c in curves.items():
        for p in c:
            lines.append(f"| {name} | {p['version']} | {p['rl_s']:.0f} | {p['accuracy']:.3f} | {p['tool_call_rate']:.3f} |")
    lines += ["", f"Same wall-clock budget ({budget:.0f} s of RL, the shorter run's): "]
    for name, c in curves.items():
        within = [p for p in c if p["rl_s"] <= budget + 1e-6]
        p = within[-1]
        lines.append(f"- {name}: {p['accuracy']:.3f} at version {p['version']} ({p['rl_s']:.0f} s), from {c[0]['accuracy']:.3f} before RL; "
                     f"whole command {wall[name]:.0f} s")
    emit("\n".join(lines), "ppo_vs_grpo", args.write, section="PPO with a critic vs GRPO")


if __name__ == "__main__":
    main()
