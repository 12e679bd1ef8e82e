"""The live progress panel and the metrics logger's two console modes."""

import io
import json

from rich.console import Console

from agentrl.engine.metrics import MetricsLogger
from agentrl.engine.progress import render_step

STEP = {
    "step": 7, "version": 7, "reward_mean": 0.625, "gen_tokens_per_s": 812.5, "train_tokens_per_s": 2048.0,
    "queue_depth": 12, "started": 288, "turns_mean": 1.75, "tool_calls_mean": 0.875, "tool_errors_mean": 0.125,
    "infra_failures": 3, "dropped_stale": 1, "staleness_hist": {"0": 4, "1": 28}, "time": 93.2,
}


def _text(renderable, width: int = 140) -> str:
    console = Console(file=io.StringIO(), width=width, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


def test_panel_shows_every_quantity() -> None:
    text = _text(render_step(STEP, max_steps=120, recent_rewards=[0.5, 0.75]))
    for expected in (
        "7 / 120", "v7", "0.625", "(last 2: 0.625)", "generation 812.5", "training 2048.0",
        "12 samples waiting", "288 started", "0.88 tool calls", "0.12 tool errors", "infra 3",
        "over-stale dropped 1", "93 s",
    ):
        assert expected in text, (expected, text)
    bars = [line for line in text.splitlines() if "█" in line]
    assert len(bars) == 2
    assert bars[0].count("█") < bars[1].count("█")  # 4 samples at staleness 0, 28 at 1


def test_logger_live_panel_and_plain_lines(tmp_path) -> None:
    out = io.StringIO()
    live = MetricsLogger(tmp_path / "a", console=Console(file=out, width=140, force_terminal=True), live=True, max_steps=10)
    live.event("generators ready")
    live.step(**STEP)
    live.step(**{**STEP, "step": 8, "version": 8})
    live.close()
    shown = out.getvalue()
    assert "generators ready" in shown and "8 / 10" in shown
    records = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in records] == ["event", "step", "step"]

    plain = io.StringIO()
    log = MetricsLogger(tmp_path / "b", console=Console(file=plain, width=200))
    assert log.view is None  # not a terminal: one line per step
    log.step(**STEP)
    log.close()
    assert "step    7 v7" in plain.getvalue() and "staleness {0:4 1:28}" in plain.getvalue()


def test_brackets_in_events_and_warnings_are_printed_not_taken_for_markup(tmp_path) -> None:
    """The degenerate-step warning printed "warm it up with , raise ...": rich took `[sft]` for a tag."""
    out = io.StringIO()
    log = MetricsLogger(tmp_path, console=Console(file=out, width=200))
    log.warning("no reward: warm it up with [sft], raise rollout.max_new_tokens")
    log.event("section [learner] and [bold]not bold[/bold]")
    log.close()
    shown = out.getvalue()
    assert "warm it up with [sft], raise" in shown
    assert "section [learner] and [bold]not bold[/bold]" in shown
