"""``agentrl report RUN_DIR``: plots and a short summary of a finished (or running) run.

Reads ``RUN_DIR/metrics.jsonl`` and writes into ``RUN_DIR/report/``:

- ``training.png``: four panels over wall-clock time — mean training reward per learner step,
  held-out accuracy per evaluation (of every held-out set, with tool-call rate), the staleness of trained samples
  (stacked: how many versions behind the learner), generation and training tokens/s;
- ``summary.md``: the numbers behind it (every evaluation with ReTool's measurements of tool use,
  the accuracy gained on each held-out set, steps, duration, throughput,
  stale drops, infra failures; under refill, groups sampled, with a signal, set aside);
- ``index.html``: one self-contained page with interactive curves, the evaluation table and a
  trajectory browser whose tokens are coloured by the weight version that wrote them
  (:mod:`agentrl.report_html`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentrl.engine.loop.evaluation import eval_sets
from agentrl.engine.metrics import read_metrics
from agentrl.report_html import TOOL_USE_COLUMNS, write_html_report
from agentrl.errors import DataError

__all__ = ["write_report"]


def _series(records: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    pts = [(r["time"], r[key]) for r in records if key in r]
    return [p[0] for p in pts], [p[1] for p in pts]


def write_report(run_dir: str | Path) -> Path:
    """Write ``report/training.png``, ``report/summary.md`` and ``report/index.html`` for
    ``run_dir``; return the folder."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        raise DataError(f"{path}: no metrics (is {run_dir} a run directory?)")
    records = read_metrics(path)
    steps = [r for r in records if r.get("kind") == "step"]
    evals = [r for r in records if r.get("kind") == "eval"]
    sft = [r for r in records if r.get("kind") == "sft"]
    out = run_dir / "report"
    out.mkdir(exist_ok=True)

    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    ax = axes[0][0]
    t, y = _series(steps, "reward_mean")
    ax.plot(t, y, marker=".", label="training reward (batch mean)")
    ax.set_title("reward")
    ax.set_xlabel("time (s)")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(loc="lower right", fontsize=8)

    ax = axes[0][1]
    t, y = _series(evals, "accuracy")
    ax.plot(t, y, marker="o", label="held-out accuracy")
    for name in eval_sets(evals):
        t1, y1 = _series(evals, f"{name}/accuracy")
        ax.plot(t1, y1, marker="s", label=f"held-out accuracy ({name})")
    t2, y2 = _series(evals, "tool_call_rate")
    ax.plot(t2, y2, marker="x", linestyle="--", label="tool-call rate")
    for r in evals:
        ax.annotate(f"v{r['version']}", (r["time"], r["accuracy"]), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_title("held-out evaluation")
    ax.set_xlabel("time (s)")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(loc="lower right", fontsize=8)

    ax = axes[1][0]
    if steps:
        lags = sorted({int(k) for r in steps for k in r.get("staleness_hist", {})})
        bottom = [0.0] * len(steps)
        xs = [r["step"] for r in steps]
        for lag in lags:
            h = [float(r.get("staleness_hist", {}).get(str(lag), 0)) for r in steps]
            ax.bar(xs, h, bottom=bottom, label=f"{lag} behind")
            bottom = [b + v for b, v in zip(bottom, h)]
        ax.legend(fontsize=8)
    ax.set_title("staleness of trained samples")
    ax.set_xlabel("learner step")
    ax.set_ylabel("samples")

    ax = axes[1][1]
    t, y = _series(steps, "gen_tokens_per_s")
    ax.plot(t, y, label="generation tok/s (cumulative)")
    t, y = _series(steps, "train_tokens_per_s")
    ax.plot(t, y, label="training tok/s (per step)")
    ax.set_title("throughput")
    ax.set_xlabel("time (s)")
    ax.legend(fontsize=8)
    fig.suptitle(f"agentrl run: {run_dir.name}")
    fig.tight_layout()
    fig.savefig(out / "training.png", dpi=110)
    plt.close(fig)

    lines = [f"# Run report: `{run_dir}`", ""]
    if sft:
        lines.append(f"- SFT warm-up: {int(sft[-1]['step'])} steps, final loss {sft[-1]['sft_loss']:.4f}")
    if steps:
        last = steps[-1]
        lines += [
            f"- RL: {int(last['step'])} learner steps, weight version {int(last['version'])}, "
            f"{last['time']:.0f} s since start",
            f"- training reward: first step {steps[0]['reward_mean']:.3f}, last step {last['reward_mean']:.3f}",
            f"- generation {last.get('gen_tokens_per_s', 0):.0f} tok/s (cumulative), "
            f"samples dropped as stale {int(last.get('dropped_stale', 0))}, infra failures {int(last.get('infra_failures', 0))}",
        ]
        if any(r.get("set_aside_solved") or r.get("set_aside_failed") for r in steps):  # refill
            sampled, signal = sum(r.get("groups_sampled", 0) for r in steps), sum(r.get("groups_with_signal", 0) for r in steps)
            lines.append(
                f"- dynamic sampling: {sampled} groups sampled, {signal} with a learning signal trained; set aside "
                f"{sum(r.get('set_aside_solved', 0) for r in steps)} solved, {sum(r.get('set_aside_failed', 0) for r in steps)} "
                f"failed; refill factor {sum(r.get('refill_factor', 1.0) for r in steps) / len(steps):.2f} on average (groups sampled / the batch's groups)"
            )
    if evals:
        sets = eval_sets(evals)
        cols = [("accuracy", "accuracy", "{:.3f}"), *((f"{n}/accuracy", f"{n} accuracy", "{:.3f}") for n in sets), *TOOL_USE_COLUMNS,
                ("turns_mean", "turns", "{:.2f}"), ("episodes", "episodes", "{:.0f}")]
        lines += ["", "| eval | version | " + " | ".join(c[1] for c in cols) + " |", "| --- " * (len(cols) + 2) + "|"]
        for i, r in enumerate(evals):
            label = "before RL" if i == 0 else ("after RL" if i == len(evals) - 1 else "during")
            cells = [fmt.format(r[k]) if isinstance(r.get(k), (int, float)) else "" for k, _, fmt in cols]
            lines.append(f"| {label} | {r['version']} | " + " | ".join(cells) + " |")
        if len(evals) > 1:
            lines += ["", f"Held-out accuracy gain: **{100 * (evals[-1]['accuracy'] - evals[0]['accuracy']):+.1f} points**."]
            for name in sets:
                a, b = evals[0].get(f"{name}/accuracy"), evals[-1].get(f"{name}/accuracy")
                if isinstance(a, (int, float)) and isinstance(b, (int, float)):
                    lines.append(f"Held-out accuracy gain on `{name}`: **{100 * (b - a):+.1f} points**.")
    lines += ["", "![training](training.png)", "", "Trajectories and interactive curves: [index.html](index.html).", ""]
    (out / "summary.md").write_text("\n".join(lines))
    write_html_report(run_dir, records, out)
    return out
