"""One decision about the model for the run and its dry run (agentrl.model_plan)."""

from __future__ import annotations

from agentrl.config import load_recipe
from agentrl.model_plan import plan_model


def test_a_missing_or_empty_folder_is_built_or_imported_a_full_one_is_used(tmp_path):
    missing, empty, full = tmp_path / "missing", tmp_path / "empty", tmp_path / "full"
    empty.mkdir()
    full.mkdir()
    (full / "config.json").write_text("{}")
    for where in (missing, empty):
        assert plan_model(str(where), build="tiny").action == "build"
        assert plan_model(str(where), import_="smollm2-135m-instruct").action == "import"
    assert plan_model(str(full), build="tiny").action == "use"
    assert plan_model(str(full), import_="x").action == "use"
    assert plan_model("Qwen/Qwen2.5-0.5B-Instruct").action == "use"


def test_the_dry_run_and_the_run_agree_on_an_empty_folder(tmp_path):
    """The dry run used to say "will be built" only for a missing path, while the run also
    builds into an empty folder: both now read plan_model."""
    from agentrl.dryrun import dry_run

    empty = tmp_path / "m"
    empty.mkdir()
    recipe = load_recipe("recipes/tiny_calc.toml", overrides=[f'model.path="{empty}"'])
    lines: list[str] = []
    dry_run(recipe, echo=lines.append)
    model_line = next(line for line in lines if line.split()[1:2] == ["model"])
    assert model_line.split()[0] == "ok" and "will be built (tiny)" in model_line


def test_set_null_unsets_an_optional_key_and_the_tutorials_hub_command_validates():
    """docs/tutorial.md §6: `--set model.path=Qwen/... --set model.build=null` (it was rejected:
    "got 'null' (str)")."""
    from agentrl.config import load_recipe

    r = load_recipe("recipes/tiny_calc.toml", ["model.path=Qwen/Qwen2.5-0.5B-Instruct", "model.build=null", "model.dtype=bfloat16"])
    assert (r.model.path, r.model.build, r.model.dtype) == ("Qwen/Qwen2.5-0.5B-Instruct", None, "bfloat16")
    assert load_recipe("recipes/smol_calc.toml", ["model.import=null"]).model.import_ is None


def test_a_hub_id_is_never_built_over(tmp_path, monkeypatch):
    """Without `model.build=null`, the tutorial's command used to build a tiny random model into a
    folder named Qwen/Qwen2.5-0.5B-Instruct; now the recipe is refused, naming the fix."""
    import pytest

    from agentrl.config import load_recipe
    from agentrl.errors import ConfigError

    monkeypatch.chdir(tmp_path)
    (tmp_path / "recipe.toml").write_text(open(f"{__import__('pathlib').Path(__file__).parents[1]}/recipes/tiny_calc.toml").read())
    with pytest.raises(ConfigError, match=r"spelled like a hub id.*model\.build=null.*'\./Qwen/Qwen2\.5-0\.5B-Instruct'"):
        load_recipe("recipe.toml", ["model.path=Qwen/Qwen2.5-0.5B-Instruct"])
    with pytest.raises(ConfigError, match=r"model\.import=null"):
        load_recipe("recipe.toml", ["model.path=org/name", "model.build=null", 'model.import="smollm2-135m-instruct"'])
    # the same name as a local folder builds; an existing folder of that name is used, not built over
    assert load_recipe("recipe.toml", ["model.path=./Qwen/Qwen2.5-0.5B-Instruct"]).model.build == "tiny"
    (tmp_path / "org" / "name").mkdir(parents=True)
    (tmp_path / "org" / "name" / "config.json").write_text("{}")
    assert load_recipe("recipe.toml", ["model.path=org/name"]).model.path == "org/name"
    assert plan_model("org/name", build="tiny").action == "use"


def test_the_cli_runs_the_tutorials_hub_command_as_far_as_the_dry_run(tmp_path):
    """The command as written, with a local folder standing in for the hub model: the dry run
    resolves it as a model to load (never "will be built")."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).parents[1]
    proc = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "check", str(repo / "recipes/tiny_calc.toml"), "--dry-run",
         "--set", "model.path=Qwen/Qwen2.5-0.5B-Instruct", "--set", "model.build=null", "--set", "model.dtype=bfloat16"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"},
    )
    model_line = next(line for line in proc.stdout.splitlines() if line.split()[1:2] == ["model"])
    assert "will be built" not in model_line and "Qwen/Qwen2.5-0.5B-Instruct" in model_line, proc.stdout + proc.stderr
    # the prompt line says why it is not rendered: the hub model is loaded, not built (it used to
    # say "does not exist yet (it is built or imported by the run)")
    prompt_line = next(line for line in proc.stdout.splitlines() if line.split()[1:2] == ["prompt"])
    assert prompt_line.split()[0] == "offline", proc.stdout + proc.stderr
    assert prompt_line.split(None, 2)[2] == "not rendered: hub model not reachable or cached here", proc.stdout + proc.stderr
