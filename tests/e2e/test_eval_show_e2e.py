"""``agentrl eval RECIPE --show N`` for real (issue 36, "seeing before training"): the tiny model
on the tiny recipe's environment through vLLM, Ray and the sandbox, nothing trained; N episodes
printed turn by turn with their rewards, at least N rows evaluated (eval.limit raised), and the
same episodes in eval_samples.jsonl for the report's browser, all in the evaluation's own folder
RUN_DIR/evals/<date-time>/: a training run's files in RUN_DIR stay byte for byte as they were."""

import json
import re
import subprocess
import sys

import pytest

from tests.e2e.helpers import REPO

SHOW = 3


@pytest.mark.e2e
@pytest.mark.vllm
def test_eval_show_prints_n_episodes_turn_by_turn(tmp_path, tiny_calc_model):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    training = {"summary.json": '{"steps": 40}', "metrics.jsonl": '{"kind": "step", "time": 1.0, "step": 1}\n', "eval_samples.jsonl": ""}
    for name, text in training.items():  # what a training run left in the recipe's run directory
        (run_dir / name).write_text(text)
    cmd = [sys.executable, "-m", "agentrl.cli", "eval", str(REPO / "recipes" / "tiny_calc.toml"), "--show", str(SHOW),
           "--set", f"run_dir='{run_dir}'", "--set", f"model.path='{tiny_calc_model}'", "--set", "eval.limit=2",
           "--set", "rollout.max_new_tokens=24"]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    assert {name: (run_dir / name).read_text() for name in training} == training
    [eval_dir] = list((run_dir / "evals").iterdir())
    records = [json.loads(line) for line in (eval_dir / "metrics.jsonl").read_text().splitlines()]
    [evaluation] = [r for r in records if r["kind"] == "eval"]
    assert evaluation["episodes"] + evaluation["infra_failures"] == SHOW  # eval.limit=2 raised to the 3 shown
    assert not [r for r in records if r["kind"] == "step"]  # nothing trained
    assert json.loads((eval_dir / "summary.json").read_text())["eval_after"]["accuracy"] == evaluation["accuracy"]
    saved = [json.loads(line) for line in (eval_dir / "eval_samples.jsonl").read_text().splitlines()]
    assert len(saved) == SHOW
    out = done.stdout
    headers = re.findall(r"^── episode (\d) of (\d) · reward (-?\d\.\d{3}) · (\w+)", out, re.MULTILINE)
    assert [(int(i), int(n)) for i, n, *_ in headers] == [(i, SHOW) for i in range(1, SHOW + 1)], out
    assert [float(h[2]) for h in headers] == [pytest.approx(s["reward"], abs=1e-3) for s in saved]
    blocks = out.split("── episode ")[1:]
    roles = [[line.split()[0] for line in block.splitlines()[1:] if line and not line.startswith(" ")] for block in blocks]
    assert all(r[:2] == ["system", "user"] for r in roles), out  # the prompt as the model saw it
    assert any("assistant" in r for r in roles), out  # then the model's turns (an untrained model may write nothing)
    assert "Compute" in blocks[0]  # the row's question, as the model saw it
    assert out.splitlines()[-1] == (f"evaluation written to {eval_dir} (summary.json, metrics.jsonl, eval_samples.jsonl); "
                                    f"report (plots, the trajectory browser): {eval_dir / 'report' / 'index.html'}")
