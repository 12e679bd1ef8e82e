"""The user's own modules: the CLI finds them beside the recipe or in the current directory
(no PYTHONPATH), and a run ships the ones the recipe names to every Ray worker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.config import validate_recipe
from agentrl.engine import wiring
from agentrl.user_code import referenced_modules, shipped_modules, user_runtime_env

REPO = Path(__file__).resolve().parents[1]

USER_ENV = '''
from typing import Any

from agentrl.envs.base import TextEnv


class EchoEnv(TextEnv):
    """One turn; reward 1.0 when the answer repeats the question."""

    required_fields = ("question",)

    def __init__(self, sandbox: Any = None, bonus: float = 0.0) -> None:
        super().__init__()
        self.bonus = bonus

    def initial_messages(self, row):
        return [{"role": "user", "content": row["question"]}]

    async def astep(self, action):
        self.start_turn()
        self.done = True
        return [], float(action.strip() == self.row["question"]) + self.bonus, True, False, self.make_info("ok")
'''


def _project(root: Path, model: Path | str = "unused-model") -> Path:
    """A user's project: a recipe beside its environment module ``my_envs.py``."""
    root.mkdir(parents=True)
    (root / "my_envs.py").write_text(USER_ENV)
    recipe = root / "recipe.toml"
    recipe.write_text(
        f'name = "mine"\nrun_dir = "{root / "run"}"\n[model]\npath = "{model}"\n[env]\nid = "my_envs:EchoEnv"\nkwargs = {{ bonus = 0.5 }}\n'
        '[sandbox]\ntype = "unsafe-local"\n[eval]\nlimit = 0\n'
    )
    return recipe


def test_the_modules_a_recipe_names_are_found_beside_it(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "solo.py").write_text("")
    values = {"env": {"id": "solo:Env", "agent": "pkg.agents:run"}, "sft": {"source": "agentrl.envs.calc_demos:demonstrations"},
              "model": {"path": "Qwen/Qwen2.5-0.5B-Instruct"}, "data": {"source": "openai/gsm8k:main"}}
    refs = referenced_modules(values)
    assert {"solo", "pkg", "agentrl"} <= refs
    assert shipped_modules(refs, [tmp_path / "nowhere", tmp_path]) == [tmp_path / "pkg", tmp_path / "solo.py"]
    assert user_runtime_env(values, dirs=[]) == {}
    env = user_runtime_env(values, dirs=[tmp_path])
    assert env["py_modules"] == [str(tmp_path / "pkg"), str(tmp_path / "solo.py")]
    assert env["env_vars"]["PYTHONPATH"].split(os.pathsep)[0] == str(tmp_path)


def test_the_ray_job_carries_the_users_modules(tmp_path, monkeypatch):
    import agentrl.user_code as uc

    recipe = validate_recipe({"model": {"path": "m"}, "env": {"id": "my_envs:EchoEnv"}})
    assert "py_modules" not in wiring.ray_init_kwargs(recipe)["runtime_env"]  # the engine used directly: nothing to ship
    _project(tmp_path / "proj")
    monkeypatch.setattr(uc, "_DIRS", [tmp_path / "proj"])
    env = wiring.ray_init_kwargs(recipe)["runtime_env"]
    assert env["py_modules"] == [str(tmp_path / "proj" / "my_envs.py")]
    assert env["worker_process_setup_hook"] == wiring.JOB_RUNTIME_ENV["worker_process_setup_hook"]


@pytest.mark.ray
def test_a_ray_worker_imports_the_shipped_module_after_the_original_is_gone(tmp_path):
    """py_modules really ships the file: the worker imports Ray's copy (the original folder is
    deleted before the task runs, and the worker's PYTHONPATH does not name it)."""
    script = tmp_path / "driver.py"
    script.write_text(f'''
import shutil, sys
from pathlib import Path
import ray
from agentrl.user_code import user_runtime_env
proj = Path({str(tmp_path / "proj")!r})
env = user_runtime_env({{"env": {{"id": "my_envs:EchoEnv"}}}}, dirs=[proj])
env.pop("env_vars")
ray.init(num_cpus=1, include_dashboard=False, runtime_env=env, logging_level="error")
shutil.rmtree(proj)

@ray.remote
def where():
    import my_envs
    return my_envs.__file__, my_envs.EchoEnv.__name__

print(ray.get(where.remote(), timeout=120))
ray.shutdown()
''')
    _project(tmp_path / "proj")
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env={**environ, "RAY_AUTH_MODE": "token"},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "EchoEnv" in done.stdout and str(tmp_path / "proj") not in done.stdout, done.stdout


def test_check_finds_a_module_beside_the_recipe_without_pythonpath(tmp_path, tiny_calc_model):
    recipe = _project(tmp_path / "proj", tiny_calc_model)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-m", "agentrl.cli", "check", str(recipe), "--dry-run"], cwd=elsewhere, env=environ,
                          capture_output=True, text=True, timeout=300)
    env_line = next((line for line in done.stdout.splitlines() if " environment " in line), done.stdout + done.stderr)
    assert env_line.split()[0] == "ok" and "my_envs:EchoEnv" in env_line, env_line
    # the current directory counts too: the recipe moved away from its module
    (tmp_path / "recipes").mkdir()
    moved = tmp_path / "recipes" / "recipe.toml"
    moved.write_text(recipe.read_text())
    (elsewhere / "my_envs.py").write_text(USER_ENV)
    done = subprocess.run([sys.executable, "-m", "agentrl.cli", "check", str(moved), "--dry-run"], cwd=elsewhere, env=environ,
                          capture_output=True, text=True, timeout=300)
    env_line = next((line for line in done.stdout.splitlines() if " environment " in line), done.stdout + done.stderr)
    assert env_line.split()[0] == "ok", env_line

