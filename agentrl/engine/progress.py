"""The live progress view of a run (rich): one panel, redrawn after every learner step.

Shown only when the console is a terminal; elsewhere (CI logs, files) the metrics logger prints
one line per step instead. The panel reads the same step records that go to ``metrics.jsonl``:

* step / max steps and the learner's weight version;
* reward: last step and mean of the last 10 steps;
* generation and training throughput, tokens/s;
* queue depth (finished samples waiting) and samples started;
* staleness histogram of the last batch (versions behind the learner -> samples), as bars;
* tool use: tool calls and tool errors per episode; infrastructure failures (sandbox, verifier,
  generator) and over-stale drops since the start.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table

__all__ = ["ProgressView", "format_eta", "render_step"]

_BAR_WIDTH = 24


def _bars(hist: dict[str, int]) -> str:
    """``{"0": 3, "1": 29}`` as one text bar per staleness value."""
    if not hist:
        return "-"
    top = max(hist.values()) or 1
    rows = []
    for k, v in sorted(hist.items(), key=lambda kv: int(kv[0])):
        rows.append(f"{k:>2} {'█' * max(1, round(_BAR_WIDTH * v / top))} {v}")
    return "\n".join(rows)


def format_eta(seconds: float) -> str:
    """``seconds`` as ``45s``, ``3m05s`` or ``2h07m`` (rounded to the second or the minute)."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    m = round(seconds / 60)
    return f"{m // 60}h{m % 60:02d}m"


def render_step(
    rec: dict[str, Any], *, max_steps: int | None = None, recent_rewards: list[float] | None = None, eta_s: float | None = None,
) -> Panel:
    """The panel for one step record (the fields :meth:`RLLoop._train <agentrl.engine.loop.loop.RLLoop._train>` logs); ``eta_s``: the
    time left until ``max_steps`` (None: not known yet)."""
    recent = recent_rewards or [rec.get("reward_mean", 0.0)]
    left = Table.grid(padding=(0, 2))
    left.add_column(style="bold")
    left.add_column()
    total = f" / {max_steps}" if max_steps else ""
    left.add_row("step", f"{rec.get('step', 0)}{total}   weight version v{rec.get('version', 0)}")
    left.add_row("reward", f"{rec.get('reward_mean', 0.0):.3f}   (last {len(recent)}: {sum(recent) / len(recent):.3f})")
    left.add_row("tokens/s", f"generation {rec.get('gen_tokens_per_s', 0.0):.1f}   training {rec.get('train_tokens_per_s', 0.0):.1f}")
    left.add_row("queue", f"{rec.get('queue_depth', 0)} samples waiting   {rec.get('started', 0)} started")
    left.add_row(
        "episodes",
        f"{rec.get('turns_mean', 0.0):.2f} turns  {rec.get('tool_calls_mean', 0.0):.2f} tool calls  "
        f"{rec.get('tool_errors_mean', 0.0):.2f} tool errors",
    )
    left.add_row(
        "failures",
        f"infra {rec.get('infra_failures', 0)}   over-stale dropped {rec.get('dropped_stale', 0)}",
    )
    left.add_row("elapsed", f"{rec.get('time', 0.0):.0f} s" + (f"   eta {format_eta(eta_s)}" if eta_s is not None else ""))
    right = Table.grid()
    right.add_column()
    right.add_row("[bold]staleness[/] (versions behind: samples)")
    right.add_row(_bars({str(k): int(v) for k, v in rec.get("staleness_hist", {}).items()}))
    body = Table.grid(padding=(0, 4))
    body.add_column()
    body.add_column()
    body.add_row(left, right)
    return Panel(Group(body), title="agentrl", title_align="left")


class ProgressView:
    """A rich ``Live`` panel that the metrics logger updates after every step.

    Events printed through the same console appear above the panel."""

    def __init__(self, console: Console, *, max_steps: int | None = None) -> None:
        self.console = console
        self.max_steps = max_steps
        self._rewards: deque[float] = deque(maxlen=10)
        self._live: Live | None = None

    def update(self, rec: dict[str, Any], *, eta_s: float | None = None) -> None:
        """Redraw the panel for step record ``rec`` (``eta_s``: the time left, when known)."""
        self._rewards.append(float(rec.get("reward_mean", 0.0)))
        panel = render_step(rec, max_steps=self.max_steps, recent_rewards=list(self._rewards), eta_s=eta_s)
        if self._live is None:
            self._live = Live(panel, console=self.console, refresh_per_second=2, transient=False)
            self._live.start()
        else:
            self._live.update(panel, refresh=True)

    def close(self) -> None:
        """Stop redrawing (the last panel stays on screen)."""
        if self._live is not None:
            self._live.stop()
            self._live = None
