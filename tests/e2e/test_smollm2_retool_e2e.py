"""``agentrl train recipes/smol_retool.toml``, reduced: SmolLM2-135M-Instruct warmed up on the
tool-integrated math demonstrations, then 2 RL steps of ``agentrl/MathTool-v0`` on systems of two
equations (``synthetic:system``), whose demonstrated solution imports sympy in the sandbox. It is
evaluated in distribution and out of it (``eval.sets.ood``) with ReTool's measurements of tool
use, and ``agentrl report`` shows them. The full comparison with the text-only recipe is
``benchmarks/retool_laptop.py`` (README "ReTool on a laptop")."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from agentrl.cli import train_command
from tests.e2e.helpers import REPO, steps

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]

TOOL_USE = ("tool_call_rate", "tool_calls_mean", "tool_error_rate", "tool_error_episodes", "recovery_rate", "response_tokens_mean")


def _texts(path) -> list[str]:
    return [json.loads(line)["text"] for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def test_smol_retool_trains_with_sympy_in_the_sandbox_and_reports_retools_measurements(tmp_path, smol_model) -> None:
    run_dir = tmp_path / "run"
    cmd = train_command(
        str(REPO / "recipes" / "smol_retool.toml"), str(run_dir), str(smol_model),
        'data.source="synthetic:system"', "sft.steps=8", "sft.batch_size=8", "sft.lr=2e-4", "sft.num_examples=64",
        "learner.max_steps=2", "learner.batch_size=8",
        "rollout.max_concurrent_episodes=8", "eval.limit=8", "eval.sets.ood.limit=4", "eval.every_steps=0", "eval.samples=8",
    )
    run = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1500, env={**os.environ, "RAY_DEDUP_LOGS": "0"})
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-5000:]
    assert steps(run_dir) == [1, 2]

    evals = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if '"kind": "eval"' in x]
    assert [e["version"] for e in evals] == [0, 2]
    for e in evals:
        assert e["episodes"] == 8 and e["ood/episodes"] == 4, e
        assert all(k in e and f"ood/{k}" in e for k in TOOL_USE), sorted(e)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert "ood/accuracy" in summary["eval_after"] and "recovery_rate" in summary["eval_after"]

    # sympy ran in the sandbox: a code block that imports it came back with a value, not an error
    ran = [m for t in _texts(run_dir / "samples.jsonl") + _texts(run_dir / "eval_samples.jsonl")
           for m in re.finditer(r"<code>(.*?)</code>.*?<interpreter>\n?(.*?)</interpreter>", t, re.S)
           if "sympy" in m.group(1)]
    assert ran, "no episode ran a code block that imports sympy"
    assert any(out.strip() and "Error" not in out for _, out in (m.groups() for m in ran)), [m.group(2) for m in ran][:5]

    r = subprocess.run([sys.executable, "-m", "agentrl.cli", "report", str(run_dir)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    md = (run_dir / "report" / "summary.md").read_text()
    assert "| ood accuracy |" in md and "| recovery rate |" in md and "code error rate" in md, md
    assert "Held-out accuracy gain on `ood`" in md
    page = (run_dir / "report" / "index.html").read_text()
    assert "tool use at each evaluation" in page and "held-out accuracy (ood)" in page
