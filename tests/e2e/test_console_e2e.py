"""A healthy `agentrl train` keeps the console for agentrl: vLLM's, Ray's and transformers' output
goes to RUN_DIR/logs/, one file per actor.

The console is checked against an allowlist: every line printed must be one of agentrl's own
(:func:`foreign_lines`), so a library's warning or progress bar fails the test whatever it says."""

import json
import os
import re
import subprocess

import pytest
from rich.markup import escape
from rich.text import Text

from tests.e2e.helpers import REPO, train_cmd

AGENTRL_LINES = (
    # the progress line of every learner step off a terminal (agentrl.engine.metrics.MetricsLogger.step)
    r"step +\d+ v\d+ +reward -?\d+\.\d{3}  gen +\d+\.\d tok/s  train +\d+\.\d tok/s  queue +\d+  "
    r"staleness \{(\d+:\d+( \d+:\d+)*)?\}  infra \d+  t=\d+s(  \(judge/RM could not score \d+\))?",
    # an evaluation (agentrl.engine.loop.evaluation.Evaluator)
    r"eval v\d+: accuracy \d\.\d{3}  tool-call rate \d\.\d{3}  turns \d+\.\d{2}  \(\d+ episodes, \d+ s\)",
    # the last line of `agentrl train` (agentrl.cli)
    r"done: \d+ steps, weight version \d+, \d+ samples trained, \d+ dropped as stale, \d+ infra failures, "
    r"\d+ agent failures; checkpoint \S+",
)


def foreign_lines(console: str, run_dir) -> list[str]:
    """The lines of ``console`` that are not agentrl's: each must match one of ``AGENTRL_LINES``,
    or be an event or a warning the run logged in ``RUN_DIR/metrics.jsonl``, as
    ``MetricsLogger.event`` / ``.warning`` print it (rich markup around the escaped message:
    ``[dim]message[/]``, ``[bold yellow]warning:[/] message``; brackets in a message are text)."""
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    logged = set()
    for e in events:
        if e["kind"] == "event":
            message = escape(e["message"])
            printed = f"[bold yellow]warning:[/] {message}" if e.get("warning") else f"[dim]{message}[/]"
            logged.update(Text.from_markup(printed).plain.splitlines())
    formats = [re.compile(p) for p in AGENTRL_LINES]
    return [line for line in console.splitlines() if line not in logged and not any(f.fullmatch(line) for f in formats)]


@pytest.mark.e2e
@pytest.mark.vllm
def test_a_short_run_prints_only_agentrl_lines_and_logs_the_actors_to_files(tmp_path, tiny_calc_model):
    run_dir = tmp_path / "run"
    cmd = train_cmd(
        run_dir, tiny_calc_model, "sft.steps=0", "eval.limit=8", "eval.every_steps=0", "learner.max_steps=3",
        "learner.batch_size=8", "rollout.max_new_tokens=16", "learner.max_degenerate_steps=0",
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}  # as on a fresh shell
    env["COLUMNS"] = "10000"  # off a terminal rich wraps at 80 columns: keep each printed line whole
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900, env=env)
    console = proc.stdout + proc.stderr
    assert proc.returncode == 0, console[-6000:]
    foreign = foreign_lines(console, run_dir)
    assert foreign == [], "\n".join(foreign[:20])
    assert "done: 3 steps" in console and "eval v0" in console
    logs = {p.name: p.read_text(errors="replace") for p in (run_dir / "logs").iterdir()}
    assert {"generator-0.log", "learner-0.log", "rollout-0.log"} <= set(logs)
    assert "vLLM" in logs["generator-0.log"] or "vllm" in logs["generator-0.log"]  # the engine's own lines went here
    assert "RotaryEmbedding: Failed to load weights" not in logs["generator-0.log"]  # explained and dropped at its root
