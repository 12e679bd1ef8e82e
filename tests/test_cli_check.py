"""`agentrl check --dry-run`: the header says whether the checks passed and counts the errors;
the exit status is 2 when any failed."""

from __future__ import annotations

from pathlib import Path

from agentrl.cli import main

RECIPE = str(Path(__file__).resolve().parents[1] / "recipes" / "tiny_calc.toml")


def test_the_header_counts_the_errors_and_the_status_is_2(tiny_calc_model, capsys):
    local = ["--set", f"model.path='{tiny_calc_model}'", "--set", "sandbox.type='unsafe-local'", "--set", "sandbox.preload=null"]
    assert main(["check", RECIPE, "--dry-run", *local]) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    assert header.startswith(f"{RECIPE}: ok (mode=async") and not any(r.split()[:1] == ["error"] for r in rows), header
    assert main(["check", RECIPE, "--dry-run", *local, "--set", "env.kwargs.max_turns='3'"]) == 2
    header, *rows = capsys.readouterr().out.splitlines()
    errors = [r for r in rows if r.split()[:1] == ["error"]]
    assert len(errors) == 2 and header.startswith(f"{RECIPE}: 2 errors (mode=async"), header


def test_bad_data_is_named_by_file_and_line_and_a_short_eval_set_warns(tiny_calc_model, tmp_path, capsys):
    """Through `agentrl check --dry-run`, as a user meets their data first: a broken JSONL line
    names the file and its line; a null field names the row (1-based) and the field, and lists
    only the fields with values; an eval.limit above the rows there are is a warning, counted in
    the header, the status still 0."""
    local = ["--set", f"model.path='{tiny_calc_model}'", "--set", "sandbox.type='unsafe-local'", "--set", "sandbox.preload=null"]
    broken, null, short = tmp_path / "broken.jsonl", tmp_path / "null.jsonl", tmp_path / "short.jsonl"
    broken.write_text('{"question": "a", "answer": "1"}\n{"question": "b", answer: 2}\n')
    null.write_text('{"question": "a", "answer": "1"}\n{"question": "b", "answer": null}\n')
    short.write_text('{"question": "a", "answer": "1"}\n{"question": "b", "answer": "2"}\n')

    def check(source: Path, *extra: str) -> tuple[int, str, list[str]]:
        status = main(["check", RECIPE, "--dry-run", *local, "--set", f"data.source='{source}'", *extra])
        header, *rows = capsys.readouterr().out.splitlines()
        return status, header, rows

    status, header, rows = check(broken, "--set", "eval.limit=0")
    [data] = [r for r in rows if r.split()[1:2] == ["data"]]
    assert status == 2 and header.startswith(f"{RECIPE}: 1 error"), header
    assert data.split()[0] == "error" and f"{broken}: line 2: not valid JSON" in data, data
    status, header, rows = check(null, "--set", "eval.limit=0")
    [data] = [r for r in rows if r.split()[1:2] == ["data"]]
    assert status == 2 and f"{null}: row 2 (line 2): field 'answer' is null; its fields with values: ['question']" in data, data
    status, header, rows = check(short, "--set", "eval.limit=5", "--set", f"eval.source='{short}'")
    [data] = [r for r in rows if r.split()[1:3] == ["eval", "data"]]
    assert status == 0 and header.startswith(f"{RECIPE}: ok (") and header.endswith("; 1 warning"), header
    assert data.split()[0] == "warning" and f"eval.limit = 5 but {short} [test] has only 2 rows: the run evaluates all 2" in data, data
