"""One decision about the model for the run and its dry run (agentrl.models.plan)."""

from __future__ import annotations

from agentrl.config import load_recipe
from agentrl.models.plan import plan_model


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
