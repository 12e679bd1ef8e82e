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
