"""Run metrics: one JSON object per line in ``RUN_DIR/metrics.jsonl``, TensorBoard scalars in
``RUN_DIR/tensorboard/`` (when the ``tensorboard`` package is installed) and a progress line.

Each record has ``kind`` (``step`` for a learner step, ``event`` for anything else), ``time``
(seconds since the run started) and numeric fields. The console shows one line per step:
step, weight version, mean reward, generation and training tokens/s, queue depth, staleness.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from rich.console import Console


class MetricsLogger:
    """Appends metric records to a JSONL file and prints progress."""

    def __init__(self, run_dir: Path, *, console: Console | None = None) -> None:
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.console = console or Console(stderr=True, highlight=False)
        self.t0 = time.monotonic()
        self._tb: Any = None
        try:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(self.path.parent / "tensorboard"))
        except Exception:  # tensorboard not installed: JSONL only
            self._tb = None

    def log(self, kind: str, **fields: Any) -> dict[str, Any]:
        """Append one record and return it."""
        record = {"kind": kind, "time": round(time.monotonic() - self.t0, 3), **fields}
        with self.path.open("a") as f:
            f.write(json.dumps(record, default=float) + "\n")
        if self._tb is not None and kind != "event":
            step = int(fields.get("step", fields.get("version", 0)))
            for key, value in fields.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._tb.add_scalar(f"{kind}/{key}", value, step)
            self._tb.flush()
        return record

    def step(self, **fields: Any) -> dict[str, Any]:
        """Log a learner step and print its progress line."""
        rec = self.log("step", **fields)
        hist = fields.get("staleness_hist", {})
        stale = " ".join(f"{k}:{v}" for k, v in sorted(hist.items(), key=lambda kv: int(kv[0])))
        self.console.print(
            f"[bold]step {fields.get('step', 0):>4}[/] v{fields.get('version', 0):<3} "
            f"reward {fields.get('reward_mean', 0.0):.3f}  "
            f"gen {fields.get('gen_tokens_per_s', 0.0):7.1f} tok/s  "
            f"train {fields.get('train_tokens_per_s', 0.0):7.1f} tok/s  "
            f"queue {fields.get('queue_depth', 0):>3}  staleness {{{stale}}}  "
            f"infra {fields.get('infra_failures', 0)}  t={rec['time']:.0f}s"
        )
        return rec

    def event(self, message: str, **fields: Any) -> dict[str, Any]:
        """Log and print a one-off event (start-up, checkpoint...)."""
        self.console.print(f"[dim]{message}[/]")
        return self.log("event", message=message, **fields)


    def close(self) -> None:
        """Flush and close the TensorBoard writer."""
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Read every record of a metrics.jsonl file."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
