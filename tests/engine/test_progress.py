"""The live progress panel and the metrics logger's two console modes."""

import io
import json

from rich.console import Console

from agentrl.engine.metrics import MetricsLogger
from agentrl.engine.progress import render_step
from agentrl.envs import pyast

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


class _Clock:
    """A clock the test moves by hand (seconds)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_step_lines_carry_an_eta_from_the_mean_step_time_and_the_steps_left(tmp_path) -> None:
    out = io.StringIO()
    clock = _Clock()
    log = MetricsLogger(tmp_path, console=Console(file=out, width=300), max_steps=10, clock=clock)
    for step, t in ((4, 500.0), (5, 530.0), (6, 560.0), (9, 650.0), (10, 680.0)):  # resumed at 3; start-up took 500 s
        clock.now = 1000.0 + t
        log.step(**{**{k: v for k, v in STEP.items() if k != "time"}, "step": step, "version": step})
    lines = out.getvalue().splitlines()
    assert "eta" not in lines[0]  # one step: no step time known yet (the first one holds the warm-up)
    assert lines[1].endswith("t=530s  eta 2m30s")  # 30 s a step since step 4, 5 steps left
    assert lines[2].endswith("t=560s  eta 2m00s")
    assert lines[3].endswith("t=650s  eta 30s")
    assert "eta" not in lines[4]  # the last step: nothing left
    assert log.eta_s(11, 700.0) is None
    no_length = MetricsLogger(tmp_path / "b", console=Console(file=io.StringIO()), clock=clock)
    assert no_length.eta_s(1, 10.0) is None and no_length.eta_s(2, 20.0) is None  # without max_steps: no ETA


def test_the_eta_reads_in_seconds_minutes_or_hours() -> None:
    from agentrl.engine.progress import format_eta

    assert [format_eta(s) for s in (0.4, 45, 59.6, 185, 3599, 3600, 7620, 90000)] == [
        "0s", "45s", "1m00s", "3m05s", "59m59s", "1h00m", "2h07m", "25h00m"]


def test_the_live_panel_shows_the_eta(tmp_path) -> None:
    text = _text(render_step(STEP, max_steps=120, eta_s=4000.0))
    assert "93 s   eta 1h07m" in text, text
    assert "eta" not in _text(render_step(STEP, max_steps=120))


def test_off_a_terminal_the_default_console_never_wraps_lines(tmp_path, capsys) -> None:
    """A log file got every long line broken at 80 columns (rich's width off a terminal)."""
    log = MetricsLogger(tmp_path, max_steps=50)
    assert not log.console.is_terminal and log.view is None
    long = "resuming from " + "/very/long/run/directory" * 8 + " (step 12, 3 prompts re-issued)"
    log.event(long)
    log.warning("step 3 is degenerate: " + "no reward in any episode; " * 6 + "warm it up with [sft]")
    log.step(**STEP)
    log.close()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3 and lines[0] == long, lines
    assert lines[1].startswith("warning: step 3 is degenerate") and lines[1].endswith("warm it up with [sft]")
    assert lines[2].startswith("step    7 v7") and "staleness {0:4 1:28}" in lines[2] and len(lines[2]) > 80


def test_the_first_lines_name_the_tensorboard_and_report_commands(tmp_path, monkeypatch) -> None:
    out = io.StringIO()
    run_dir = tmp_path / "my runs" / "[exp 1]"  # a space to quote, brackets that are not markup
    log = MetricsLogger(run_dir, console=Console(file=out, width=400))
    rec = log.where_to_look()
    log.close()
    said = f"curves: tensorboard --logdir '{run_dir}/tensorboard'; report (plots, trajectories): agentrl report '{run_dir}'"
    assert rec["message"] == said and out.getvalue().strip() == said
    # without the tensorboard package there is no TensorBoard to name: the report command alone
    import agentrl.engine.metrics as metrics

    def no_tensorboard(log_dir):
        raise ImportError("No module named 'tensorboard'")

    monkeypatch.setattr(metrics, "TensorBoardSink", no_tensorboard)
    out = io.StringIO()
    plain = MetricsLogger(tmp_path / "plain", console=Console(file=out, width=400))
    assert plain.where_to_look()["message"] == f"report (plots, trajectories): agentrl report {tmp_path / 'plain'}"


def _unsafe_console_interpolations(source: str) -> list[str]:
    """The values a ``*.console.print(f"...")`` call interpolates that could carry rich markup:
    anything but ``escape(...)``, a number made by ``int``/``float``/``len``/``round``/``format_eta``,
    or a value with a numeric format (``:.3f``, ``:d``...)."""
    import ast

    safe_calls = {"escape", "int", "float", "len", "round", "format_eta"}
    out = []
    for node in ast.walk(pyast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "print"
                and "console" in ast.unparse(node.func.value)):
            continue
        for arg in node.args:
            for sub in ast.walk(arg):
                if not isinstance(sub, ast.FormattedValue):
                    continue
                v = sub.value
                if isinstance(v, ast.Call) and ast.unparse(v.func) in safe_calls:
                    continue
                spec = ast.unparse(sub.format_spec) if sub.format_spec else ""
                if spec.rstrip("'\"")[-1:] in tuple("dfeg%"):
                    continue
                out.append(f"line {node.lineno}: {{{ast.unparse(v)}{':' + spec if spec else ''}}}")
    return out


def test_every_console_line_escapes_what_could_hold_brackets() -> None:
    """rich reads `[sft]` in a printed string as a tag and swallows it: whatever agentrl prints on
    its console is escaped text or a number (events and warnings escape their message)."""
    from pathlib import Path

    package = Path(__file__).resolve().parents[2] / "agentrl"
    offenders = [f"{p.relative_to(package.parent)} {hit}" for p in sorted(package.rglob("*.py"))
                 for hit in _unsafe_console_interpolations(p.read_text())]
    assert offenders == []
    # the rule finds an unescaped message
    assert _unsafe_console_interpolations('log.console.print(f"[dim]{message}[/] {escape(x)} {n:.2f} {int(k)}")') == ["line 1: {message}"]


_DEFAULT_CONSOLE_RUN = """
import sys
from pathlib import Path
from agentrl.engine.metrics import MetricsLogger

log = MetricsLogger(Path(sys.argv[1]), max_steps=3)  # the console a run gets: stderr, whatever it is
step = {"reward_mean": 0.5, "gen_tokens_per_s": 800.0, "train_tokens_per_s": 2000.0, "queue_depth": 4,
        "staleness_hist": {"0": 8}, "infra_failures": 0}
for i in (1, 2):
    log.step(step=i, version=i, **step)
mode = "LIVE" if log.view is not None else "PLAIN"
log.close()
print(mode, flush=True)  # (after close: the live panel takes stdout over while it shows)
"""


def test_a_terminal_gets_the_live_panel_and_a_file_gets_plain_lines(tmp_path) -> None:
    """The logger a run makes by default (stderr): on a real terminal (a pty) the live panel, with
    the run's progress out of max_steps; written to a file, one plain line per step."""
    import os
    import pty
    import subprocess
    import sys

    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-c", _DEFAULT_CONSOLE_RUN, str(tmp_path / "tty")], stdout=subprocess.PIPE,
                            stderr=follower, env={**os.environ, "TERM": "xterm", "COLUMNS": "120"})
    os.close(follower)
    shown = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        shown += chunk
    os.close(leader)
    mode, _ = proc.communicate(timeout=60)
    screen = shown.decode(errors="replace")
    assert proc.returncode == 0 and mode.decode().strip() == "LIVE", screen
    assert "2 / 3" in screen and "step    1 v1" not in screen, screen

    with open(tmp_path / "console.log", "w") as f:
        done = subprocess.run([sys.executable, "-c", _DEFAULT_CONSOLE_RUN, str(tmp_path / "file")], stdout=subprocess.PIPE,
                              stderr=f, timeout=60)
    lines = (tmp_path / "console.log").read_text().splitlines()
    assert done.returncode == 0 and done.stdout.decode().strip() == "PLAIN", lines
    assert [line.split(" v")[0] for line in lines if line.startswith("step")] == ["step    1", "step    2"], lines
