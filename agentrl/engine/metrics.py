"""Run metrics: one JSON object per line in ``RUN_DIR/metrics.jsonl``, TensorBoard scalars in
``RUN_DIR/tensorboard/`` (when the ``tensorboard`` package is installed), Weights & Biases when
configured (:mod:`agentrl.engine.metric_sinks`) and progress on the console.

Each record has ``kind`` (``step`` for a learner step, ``event`` for anything else), ``time``
(seconds since the run started) and numeric fields. On a terminal the console shows a live panel
(:mod:`agentrl.engine.progress`); elsewhere one line per step: step, weight version, mean reward,
generation and training tokens/s, queue depth, staleness, infrastructure failures, elapsed time and
the ETA (the mean time of this run's steps so far times the steps left to ``max_steps``; from its
second step on). Off a terminal (a log file, CI) lines are never wrapped to a width. Literal
brackets in messages are text, never rich markup.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from agentrl.engine.metric_sinks import MetricSink, TensorBoardSink, numeric_fields
from agentrl.engine.progress import ProgressView, format_eta

__all__ = ["MetricsLogger", "read_metrics"]


class MetricsLogger:
    """Appends metric records to a JSONL file and prints progress."""

    def __init__(
        self, run_dir: Path, *, console: Console | None = None, live: bool | None = None,
        max_steps: int | None = None, sinks: Sequence[MetricSink] = (), clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``console``: where to print (default: stderr, never wrapped when it is not a
        terminal); ``live``: show the live panel (default: when the console is a terminal);
        ``max_steps``: the run's length, shown in the panel and used for the ETA; ``sinks``: where
        records go besides ``metrics.jsonl`` and TensorBoard (e.g.
        :class:`~agentrl.engine.metric_sinks.WandbSink`); ``clock``: seconds, monotonic (records'
        ``time`` and the ETA)."""
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if console is None:
            console = Console(stderr=True, highlight=False)
            # a log file or a pipe has no width: rich would wrap every long line at 80 columns
            console.soft_wrap = not console.is_terminal
        self.console = console
        show = self.console.is_terminal if live is None else live
        self.max_steps = max_steps
        self.view = ProgressView(self.console, max_steps=max_steps) if show else None
        self.clock = clock
        self.t0 = clock()
        self._first_step: tuple[int, float] | None = None
        """(step, time) of the first step this logger printed: the ETA's start."""
        self.sinks: list[MetricSink] = list(sinks)
        try:
            self.sinks.insert(0, TensorBoardSink(self.path.parent / "tensorboard"))
        except ImportError:  # tensorboard not installed: no TensorBoard scalars
            pass

    def log(self, kind: str, **fields: Any) -> dict[str, Any]:
        """Append one record and return it."""
        record = {"kind": kind, "time": round(self.clock() - self.t0, 3), **fields}
        with self.path.open("a") as f:
            f.write(json.dumps(record, default=float) + "\n")
        if kind != "event":
            step = int(fields.get("step", fields.get("version", 0)))
            for sink in self.sinks:
                sink.write(kind, step, numeric_fields(fields))
        return record

    def eta_s(self, step: int, time_s: float) -> float | None:
        """Seconds left until ``max_steps`` after ``step`` logged at ``time_s``: the mean time of
        the steps since the first one this logger logged (start-up, the supervised stage and the
        first step's warm-up left out) times the steps left. None without ``max_steps``, before a
        second step, or when no step is left."""
        if self._first_step is None:
            self._first_step = (step, time_s)
        first, t_first = self._first_step
        if not self.max_steps or step <= first or step >= self.max_steps:
            return None
        return (time_s - t_first) / (step - first) * (self.max_steps - step)

    def step(self, **fields: Any) -> dict[str, Any]:
        """Log a learner step and show it (live panel or progress line, with the ETA)."""
        rec = self.log("step", **fields)
        eta = self.eta_s(int(fields.get("step", 0)), rec["time"])
        if self.view is not None:
            self.view.update(rec, eta_s=eta)
            return rec
        hist = fields.get("staleness_hist", {})
        stale = " ".join(f"{k}:{v}" for k, v in sorted(hist.items(), key=lambda kv: int(kv[0])))
        self.console.print(
            f"[bold]step {int(fields.get('step', 0)):>4}[/] v{int(fields.get('version', 0)):<3} "
            f"reward {fields.get('reward_mean', 0.0):.3f}  "
            f"gen {fields.get('gen_tokens_per_s', 0.0):7.1f} tok/s  "
            f"train {fields.get('train_tokens_per_s', 0.0):7.1f} tok/s  "
            f"queue {int(fields.get('queue_depth', 0)):>3}  staleness {{{escape(stale)}}}  "
            f"infra {int(fields.get('infra_failures', 0))}  t={rec['time']:.0f}s"
            + (f"  eta {format_eta(eta)}" if eta is not None else "")
            + (f"  (rewards not scored: {int(fields['reward_failures_batch'])})" if fields.get("reward_failures_batch") else "")
        )
        return rec

    def where_to_look(self) -> dict[str, Any]:
        """Log (and print) the event that names the commands showing this run: TensorBoard's
        (when its scalars are written here) and ``agentrl report``'s."""
        run_dir = self.path.parent
        tensorboard = any(isinstance(s, TensorBoardSink) for s in self.sinks)
        said = f"curves: tensorboard --logdir {shlex.quote(str(run_dir / 'tensorboard'))}; " if tensorboard else ""
        return self.event(f"{said}report (plots, trajectories): agentrl report {shlex.quote(str(run_dir))}")

    def event(self, message: str, **fields: Any) -> dict[str, Any]:
        """Log and print a one-off event (start-up, checkpoint...)."""
        self.console.print(f"[dim]{escape(message)}[/]")  # literal brackets ([sft]) are text, not markup
        return self.log("event", message=message, **fields)

    def warning(self, message: str, **fields: Any) -> dict[str, Any]:
        """Log and print, in yellow, something the user should act on (a degenerate step)."""
        self.console.print(f"[bold yellow]warning:[/] {escape(message)}", highlight=False)
        return self.log("event", message=message, warning=True, **fields)

    def close(self) -> None:
        """Stop the live panel; flush and close the TensorBoard writer."""
        if self.view is not None:
            self.view.close()
        for sink in self.sinks:
            sink.close()
        self.sinks = []


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Read every record of a metrics.jsonl file."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
