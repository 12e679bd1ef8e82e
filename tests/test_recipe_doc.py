"""docs/recipe.md is generated from agentrl/config.py and never goes stale: every key of every
section, with its type, default and meaning."""

from __future__ import annotations

from agentrl.config import Recipe
from agentrl.recipe_doc import DOC_PATH, _section_of, main, render


def _keys(cls, prefix=""):
    for name, field in cls.model_fields.items():
        key = field.alias or name
        section, _ = _section_of(field.annotation)
        if section is not None:
            yield from _keys(section, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", field


def test_docs_recipe_md_is_current():
    assert DOC_PATH.read_text() == render(), "docs/recipe.md is stale: run `python -m agentrl.recipe_doc`"


def test_every_key_has_a_row_with_its_default_and_meaning():
    text = render()
    keys = list(_keys(Recipe))
    assert len(keys) > 100
    for key, field in keys:
        [row] = [line for line in text.splitlines() if line.startswith(f"| `{key}` |")]
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert cells[1] and cells[2], row  # a type and a default
        assert len(cells[3]) > 5, f"{key} has no meaning: give the field a docstring in agentrl/config.py"
    assert "| `checkpoint.every_minutes` | `float ≥ 0` | `10.0` |" in text
    assert "| `model.path` | `string` | **required** |" in text
    assert "| `model.import` |" in text  # the alias, as a recipe spells it
    assert "## [reward.judge] *(optional)*" in text


def test_check_fails_on_a_stale_file(tmp_path, capsys):
    out = tmp_path / "recipe.md"
    out.write_text(render().replace("10.0", "5.0"))
    assert main(["--check", "--out", str(out)]) == 1
    assert "is stale" in capsys.readouterr().err
    assert main(["--out", str(out)]) == 0 and main(["--check", "--out", str(out)]) == 0
