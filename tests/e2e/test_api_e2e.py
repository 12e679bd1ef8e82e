"""agentrl's Python API from a plain script (issue 36): ``agentrl.check`` (validation, a bad value
raised as ConfigError naming the key, and the dry run), ``agentrl.train`` and ``agentrl.evaluate``,
called by a ``.py`` file run with ``python script.py`` from another directory, without
PYTHONPATH, on a recipe whose demonstrations come from the user's own module beside it: the
supervised stage of the tiny recipe, then an evaluation of the model it wrote, in a run directory
of its own."""

import json
import os
import subprocess
import sys

import pytest

from tests.e2e.helpers import REPO

DEMOS = '''
from agentrl.envs.calc_demos import demonstrations


def demos(n, seed=0):
    """The Calc demonstrations, counted as they are asked for."""
    return demonstrations(n, seed)
'''

SCRIPT = '''
import json
import sys

import agentrl
from agentrl.errors import ConfigError

recipe = sys.argv[1]
out = {"check": agentrl.check(recipe)}
lines = []
out["dry_run"] = agentrl.check(recipe, dry_run=True, echo=lines.append)
out["dry_run_lines"] = lines
try:
    agentrl.check(recipe, learner={"lr": "fast"})
except ConfigError as exc:
    out["refused"] = str(exc)
summary = agentrl.train(recipe, sft={"lr": 1e-3}, learner={"num_cpus": 1})
out["train"] = {"steps": summary.steps, "final": str(summary.final_checkpoint), "run_dir": str(summary.run_dir),
                "summary.json": (summary.run_dir / "summary.json").read_text()}
evaluation = agentrl.evaluate(recipe, summary.final_checkpoint, eval={"limit": 2}, rollout={"max_new_tokens": 16})
out["evaluate"] = {"steps": evaluation.steps, "run_dir": str(evaluation.run_dir)}
print("SUMMARY", json.dumps(out))
'''


@pytest.mark.vllm
def test_check_train_and_evaluate_from_a_plain_script(tmp_path, tiny_calc_model):
    proj, elsewhere = tmp_path / "proj", tmp_path / "elsewhere"
    proj.mkdir()
    elsewhere.mkdir()
    (proj / "my_demos.py").write_text(DEMOS)
    run_dir = proj / "run"
    recipe = proj / "recipe.toml"
    text = ((REPO / "recipes" / "tiny_calc.toml").read_text()
            .replace('name = "tiny_calc"\nmode = "async"', f'name = "api"\nmode = "sft"\nrun_dir = "{run_dir}"')
            .replace('path = "runs/models/tiny-calc"', f'path = "{tiny_calc_model}"')
            .replace("steps = 500\nbatch_size = 64", "steps = 2\nbatch_size = 8\nnum_examples = 32")
            .replace('source = "agentrl.envs.calc_demos:demonstrations"', 'source = "my_demos:demos"'))
    assert 'mode = "sft"' in text and "my_demos:demos" in text and "steps = 2\n" in text
    recipe.write_text(text)
    script = elsewhere / "script.py"
    script.write_text(SCRIPT)
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, str(script), str(recipe)], cwd=elsewhere, env=environ, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-5000:]
    [line] = [x for x in done.stdout.splitlines() if x.startswith("SUMMARY ")]
    out = json.loads(line.removeprefix("SUMMARY "))
    # agentrl.check: valid; the dry run's lines through echo, every check passed; a bad value refused by key
    assert out["check"] is True
    assert out["dry_run"] is True, out["dry_run_lines"]
    assert [x.split()[:2] for x in out["dry_run_lines"]][:2] == [["ok", "model"], ["ok", "data"]], out["dry_run_lines"]
    assert "learner.lr" in out["refused"], out
    # agentrl.train: the supervised stage, from the user's module, its model written
    assert out["train"]["steps"] == 2 and out["train"]["run_dir"] == str(run_dir)
    assert (run_dir / "sft" / "config.json").is_file() and out["train"]["final"] == str(run_dir / "sft")
    events = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any("from my_demos:demos" in e.get("message", "") for e in events)
    # agentrl.evaluate: that model on the recipe's rows, nothing trained, in RUN_DIR/evals/<date-time>/
    eval_dir = run_dir / "evals"
    [folder] = list(eval_dir.iterdir())
    assert out["evaluate"] == {"steps": 0, "run_dir": str(folder)}
    records = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
    [evaluation] = [r for r in records if r["kind"] == "eval"]
    assert evaluation["episodes"] + evaluation["infra_failures"] == 2 and not [r for r in records if r["kind"] == "step"]
    assert json.loads((folder / "recipe.json").read_text())["model"]["path"] == str(run_dir / "sft")
    assert json.loads((folder / "summary.json").read_text())["eval_after"]["accuracy"] == evaluation["accuracy"]
    assert (run_dir / "summary.json").read_text() == out["train"]["summary.json"]  # the training run's summary untouched
