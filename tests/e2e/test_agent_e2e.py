"""`agentrl train` with an OpenAI-SDK agent for real: vLLM behind the gateway, the agent's tool in
the bubblewrap sandbox, Ray actors and the FSDP2 learner, a few steps.

The same healthy run keeps the console for agentrl: vLLM's, Ray's and transformers' output goes
to RUN_DIR/logs/, one file per actor. The console is checked against an allowlist: every line
printed must be one of agentrl's own (:func:`tests.e2e.helpers.foreign_lines`), so a library's
warning or progress bar fails the test whatever it says. (One run covers both, formerly this test
and test_console_e2e.py's: one start-up.)"""

import json
import os
import re
import subprocess

import pytest

from agentrl.cli import train_command
from tests.e2e.helpers import REPO, foreign_lines


@pytest.mark.e2e
@pytest.mark.vllm
def test_an_agent_program_trains_end_to_end_and_the_console_shows_only_agentrl_lines(tmp_path, tiny_calc_model):
    run_dir = tmp_path / "run"
    cmd = train_command(
        str(REPO / "recipes" / "tiny_agent.toml"), str(run_dir), str(tiny_calc_model),
        "env.agent='tests.e2e.digit_agent:digit_agent'", "sft.steps=0", "eval.limit=8", "eval.every_steps=0",
        "data.limit=96", "learner.max_steps=3", "learner.batch_size=16", "rollout.group_size=4", "learner.lr=1e-2",
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}  # as on a fresh shell
    env["PYTHONPATH"] = str(REPO)  # the agent program, tests.e2e.digit_agent
    env["COLUMNS"] = "10000"  # off a terminal rich wraps at 80 columns: keep each printed line whole
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900, env=env)
    console = proc.stdout + proc.stderr
    assert proc.returncode == 0, console[-6000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["kind"] == "step"]
    assert [s["version"] for s in steps] == [1, 2, 3]
    assert all(s["agent_failures"] == 0 and s["infra_failures"] == 0 for s in steps)
    assert [s["samples_trained"] for s in steps] == [16, 16, 16]  # learner.batch_size episodes per step
    assert all(s["turns_mean"] == 2.0 for s in steps)  # both calls of every episode reached vLLM
    assert max(s["max_token_version"] for s in steps) >= 1  # tokens of published versions were trained
    assert all(s["trained_tokens"] > 0 for s in steps)
    evals = [r for r in records if r["kind"] == "eval"]
    assert [e["version"] for e in evals] == [0, 3]  # eval.every_steps=0: before RL and after the last step
    assert all(e["episodes"] == 8 and e["infra_failures"] == 0 and e["agent_failures"] == 0 and e["turns_mean"] == 2.0
               for e in evals)  # eval.limit=8 rows, every one played to its two calls

    def tool_outputs(text: str) -> list[int]:
        """What the sandbox printed, as the agent showed it to the model: len(first reply) + 1000."""
        return [int(n) for n in re.findall(r"tool says (\d+)", text)]

    # samples.jsonl: no failed episode to show, so exactly the first episode of two groups per step,
    # each decoded in full; every one shows the sandbox's output (no filter that could leave none)
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert [s["version"] for s in samples] == [1, 1, 2, 2, 3, 3]
    assert all(s["status"] == "ok" and s["turns"] == 2.0 and s["text"] for s in samples), samples
    for s in samples:
        printed = tool_outputs(s["text"])  # the sandbox ran the agent's code (an error is no number)
        assert printed and 1000 <= printed[0] <= 1100, s["text"]
    eval_samples = [json.loads(line) for line in (run_dir / "eval_samples.jsonl").read_text().splitlines()]
    assert [e["version"] for e in eval_samples] == [0] * 4 + [3] * 4  # four episodes of each evaluation
    assert all(tool_outputs(e["text"]) for e in eval_samples), eval_samples
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["agent_failures"] == 0 and summary["samples_trained"] == 48

    # the console: agentrl's lines only; the actors' output went to one log file each
    foreign = foreign_lines(console, run_dir)
    assert foreign == [], "\n".join(foreign[:20])
    assert "done: 3 steps" in console and "eval v0" in console
    logs = {p.name: p.read_text(errors="replace") for p in (run_dir / "logs").iterdir()}
    assert {"generator-0.log", "learner-0.log", "rollout-0.log"} <= set(logs), sorted(logs)
    assert "vLLM" in logs["generator-0.log"] or "vllm" in logs["generator-0.log"]  # the engine's own lines went here
    assert "RotaryEmbedding: Failed to load weights" not in logs["generator-0.log"]  # explained and dropped at its root
