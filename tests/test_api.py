"""The Python API (agentrl.api): agentrl.load/check from Python and from a plain script; what a
real agentrl.train does from a plain script is tests/e2e/test_api_e2e.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import agentrl
from agentrl.config import Recipe
from agentrl.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "recipes" / "tiny_calc.toml"


def test_import_agentrl_stays_light_and_the_api_loads_on_first_use():
    code = "import sys, agentrl; assert 'agentrl.api' not in sys.modules; agentrl.train; assert 'ray' not in sys.modules and 'torch' not in sys.modules; print('ok')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "ok", done.stderr
    assert agentrl.eval is agentrl.evaluate


def test_overrides_merge_section_by_section():
    r = agentrl.load(TINY, learner={"max_steps": 7}, model={"build": None}, set=["learner.lr=1e-5"], name="mine")
    assert (r.learner.max_steps, r.learner.lr, r.learner.batch_size) == (7, 1e-5, 32)  # batch_size kept from the file
    assert r.model.build is None and r.model.path == "runs/models/tiny-calc" and r.name == "mine"
    again = agentrl.load(r, sft={"steps": 0})
    assert isinstance(again, Recipe) and again.learner.max_steps == 7 and again.sft.steps == 0
    assert agentrl.load({"model": {"path": "m"}}).model.path == "m"


def test_errors_name_the_file_and_key():
    with pytest.raises(ConfigError, match=r"tiny_calc\.toml: learner\.lr: got 'fast' \(str\)"):
        agentrl.load(TINY, learner={"lr": "fast"})
    with pytest.raises(ConfigError, match=r"nope\.toml: recipe file not found"):
        agentrl.check(REPO / "nope.toml")
    with pytest.raises(ConfigError, match="a recipe is a TOML file's path, a dict or an agentrl.config.Recipe; got int"):
        agentrl.load(3)


def test_check_from_a_plain_script_with_a_module_beside_the_recipe(tmp_path, tiny_calc_model):
    from tests.test_user_code import _project

    recipe = _project(tmp_path / "proj", tiny_calc_model)
    script = tmp_path / "elsewhere" / "script.py"
    script.parent.mkdir()
    script.write_text(
        "import sys, agentrl\n"
        "lines = []\n"
        f"ok = agentrl.check({str(recipe)!r}, dry_run=True, echo=lines.append)\n"
        "print('\\n'.join(lines))\n"
        "print('CHECK', ok)\n"
        f"print('BAD', agentrl.check({str(recipe)!r}, dry_run=True, echo=lambda line: None, env={{'kwargs': {{'bonus': 'x'}}}}))\n"
    )
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, str(script)], cwd=script.parent, env=environ, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    env_line = next(line for line in done.stdout.splitlines() if " environment " in line)
    assert env_line.split()[0] == "ok" and "my_envs:EchoEnv" in env_line, done.stdout
    assert "BAD False" in done.stdout  # a wrongly typed env kwarg fails the dry run
