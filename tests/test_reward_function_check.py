"""``[reward] functions`` in the recipe: both spellings validate; ``agentrl check`` (through the
CLI, from another directory, without PYTHONPATH) finds a function module beside the recipe and
refuses one that does not import, is missing, is not callable or asks for what it is never given,
naming the key; ``--dry-run`` shows each function in the reward's composition; the run ships the
module to the Ray workers."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import agentrl.user_code as uc
from agentrl.cli import main
from agentrl.config import load_recipe, validate_recipe
from agentrl.engine import wiring
from agentrl.errors import ConfigError

REWARDS = '''
def brevity(completion):
    return max(0.0, 1.0 - len(completion) / 200)


async def exact(completion, row):
    return float(completion.strip() == row["answer"])


def grade(prompts, completions):
    return [0.0 for _ in completions]


threshold = 0.5
'''


def _project(root, model) -> object:
    """A recipe beside its reward functions module ``my_rewards.py``."""
    root.mkdir(parents=True)
    (root / "my_rewards.py").write_text(REWARDS)
    recipe = root / "recipe.toml"
    recipe.write_text(
        f'name = "mine"\nrun_dir = "{root / "run"}"\n[model]\npath = "{model}"\n[sandbox]\ntype = "unsafe-local"\n[eval]\nlimit = 0\n'
        '[[reward.functions]]\nfn = "my_rewards:brevity"\nweight = 0.2\n'
        '[[reward.functions]]\nfn = "my_rewards:exact"\nweight = 1.5\ntimeout_s = 5\n'
    )
    return recipe


@pytest.fixture
def isolated(monkeypatch):
    """main() puts the recipe's directory on sys.path and remembers it: undone after the test."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(uc, "_DIRS", [])
    yield
    sys.modules.pop("my_rewards", None)


def test_both_spellings_validate_and_keep_their_weights(tmp_path, tiny_calc_model):
    recipe = load_recipe(_project(tmp_path / "p", tiny_calc_model))
    assert [(f.fn, f.weight, f.timeout_s) for f in recipe.reward.functions] == [("my_rewards:brevity", 0.2, 60.0), ("my_rewards:exact", 1.5, 5.0)]
    short = validate_recipe({"model": {"path": "m"}, "reward": {"functions": ["a:b", {"fn": "c:d", "weight": -1}]}})
    assert [(f.fn, f.weight) for f in short.reward.functions] == [("a:b", 1.0), ("c:d", -1.0)]
    specs = wiring.reward_kwargs(short)["reward"].functions
    assert [(s.ref, s.weight, s.key) for s in specs] == [("a:b", 1.0, "reward.functions[0].fn"), ("c:d", -1.0, "reward.functions[1].fn")]
    with pytest.raises(ConfigError, match=r"reward\.functions\.0: .*fn 'brevity': expected 'module:function'"):
        validate_recipe({"model": {"path": "m"}, "reward": {"functions": ["brevity"]}})
    with pytest.raises(ConfigError, match=r"reward\.functions\.0\.weight"):
        validate_recipe({"model": {"path": "m"}, "reward": {"functions": [{"fn": "a:b", "weight": float("nan")}]}})


def test_check_from_another_directory_finds_the_module_and_names_a_bad_key(tmp_path, tiny_calc_model):
    recipe = _project(tmp_path / "proj", tiny_calc_model)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-m", "agentrl.cli", "check", str(recipe)], cwd=elsewhere, env=environ,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.startswith(f"{recipe}: ok"), done.stdout + done.stderr
    bad = ["--set", 'reward.functions=[{fn = "my_rewards:brevity"}, {fn = "my_rewardz:exact"}]']
    done = subprocess.run([sys.executable, "-m", "agentrl.cli", "check", str(recipe), *bad], cwd=elsewhere, env=environ,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"agentrl: error: {recipe}: reward.functions[1].fn: 'my_rewardz:exact': cannot import module 'my_rewardz'" in done.stderr, done.stderr


@pytest.mark.parametrize(("fn", "why"), [
    ("my_rewards:nothing", "reward.functions[0].fn: 'my_rewards:nothing': module 'my_rewards' has no attribute 'nothing'"),
    ("my_rewards:threshold", "reward.functions[0].fn: 'my_rewards:threshold': 'threshold' is a float, not a function"),
    ("my_rewards:grade", "reward.functions[0].fn: 'my_rewards:grade': it requires 'prompts', which a reward function is never given"),
])
def test_check_refuses_a_function_that_is_missing_not_callable_or_asks_too_much(tmp_path, tiny_calc_model, isolated, capsys, fn, why):
    recipe = _project(tmp_path / "proj", tiny_calc_model)
    assert main(["check", str(recipe), "--set", f'reward.functions=["{fn}"]']) == 2
    assert f"agentrl: error: {recipe}: {why}" in capsys.readouterr().err
    assert main(["check", str(recipe), "--dry-run", "--set", f'reward.functions=["{fn}"]']) == 2
    out = capsys.readouterr().out
    line = next(r for r in out.splitlines() if " reward " in r)
    assert line.split()[0] == "error" and why in line, out


def test_dry_run_shows_each_function_with_its_weight_and_arguments(tmp_path, tiny_calc_model, isolated, capsys):
    recipe = _project(tmp_path / "proj", tiny_calc_model)
    main(["check", str(recipe), "--dry-run"])
    line = next(r for r in capsys.readouterr().out.splitlines() if " reward " in r)
    assert line.split()[0] == "ok", line
    assert "reward = 1 * env_reward + 0.2 * fn/brevity + 1.5 * fn/exact" in line, line
    assert "functions: my_rewards:brevity(completion), my_rewards:exact(completion, row) async" in line, line


def test_the_run_ships_the_function_module_to_the_ray_workers(tmp_path, tiny_calc_model, monkeypatch):
    recipe = load_recipe(_project(tmp_path / "proj", tiny_calc_model))
    monkeypatch.setattr(uc, "_DIRS", [tmp_path / "proj"])
    assert wiring.job_runtime_env(recipe)["py_modules"] == [str(tmp_path / "proj" / "my_rewards.py")]
