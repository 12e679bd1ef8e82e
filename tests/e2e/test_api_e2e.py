"""agentrl.train from a plain script (issue 36): the supervised stage of a recipe whose
demonstrations come from the user's own module beside the recipe, run from another directory
without PYTHONPATH; the summary it returns names the model it wrote."""

import json
import os
import subprocess
import sys

DEMOS = '''
from agentrl.envs.calc_demos import demonstrations


def demos(n, seed=0):
    """The Calc demonstrations, counted as they are asked for."""
    return demonstrations(n, seed)
'''


def test_train_from_a_plain_script(tmp_path, tiny_calc_model):
    proj, elsewhere = tmp_path / "proj", tmp_path / "elsewhere"
    proj.mkdir()
    elsewhere.mkdir()
    (proj / "my_demos.py").write_text(DEMOS)
    recipe = proj / "recipe.toml"
    recipe.write_text(f'name = "api"\nrun_dir = "{proj / "run"}"\nmode = "sft"\n[model]\npath = "{tiny_calc_model}"\n'
                      '[sft]\nsteps = 2\nbatch_size = 8\nnum_examples = 32\nsource = "my_demos:demos"\n')
    script = elsewhere / "script.py"
    script.write_text(
        "import json, agentrl\n"
        f"summary = agentrl.train({str(recipe)!r}, sft={{'lr': 1e-3}}, learner={{'num_cpus': 1}})\n"
        "print('SUMMARY', json.dumps({'steps': summary.steps, 'final': str(summary.final_checkpoint), 'run_dir': str(summary.run_dir)}))\n"
    )
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, str(script)], cwd=elsewhere, env=environ, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-5000:]
    [line] = [x for x in done.stdout.splitlines() if x.startswith("SUMMARY ")]
    summary = json.loads(line.removeprefix("SUMMARY "))
    assert summary["steps"] == 2 and summary["run_dir"] == str(proj / "run")
    assert (proj / "run" / "sft" / "config.json").is_file() and summary["final"] == str(proj / "run" / "sft")
    events = [json.loads(x) for x in (proj / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any("from my_demos:demos" in e.get("message", "") for e in events)
