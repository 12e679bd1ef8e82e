"""`agentrl check --dry-run`'s data lines decide local or Hub as load_rows does: a missing CSV is
an error about the file in every row, never "hub dataset, not reachable"."""

from __future__ import annotations

from agentrl.config import validate_recipe
from agentrl.dryrun import _data


def test_a_csv_is_a_local_file_in_every_data_line(tmp_path):
    recipe = validate_recipe({"model": {"path": "m"}, "data": {"source": str(tmp_path / "train.csv")},
                              "eval": {"limit": 4, "source": str(tmp_path / "test.csv")}})
    for status, line in (_data(recipe, "train", None), _data(recipe, "test", 4, str(tmp_path / "test.csv"))):
        assert status == "error" and "no such data file" in line and "hub" not in line.lower(), line
    (tmp_path / "train.csv").write_text("question,answer\nq,1\n")
    status, line = _data(recipe, "train", None)
    assert status == "ok" and "rows load" in line, line
