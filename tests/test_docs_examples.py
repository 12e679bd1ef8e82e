"""Every Python example in the docs runs in a test: each ```python block of docs/*.md and README.md
carries an ``<!-- example: NAME -->`` marker, and a test under tests/ names it (the tests that run
them read the block by its marker, so a changed example is the one that runs). Also runs the two
examples no other test runs: Gymnasium's two forms in a fresh interpreter, and the tutorial's
Python API block against a stand-in controller (what a real ``agentrl.train`` from a script does
is tests/e2e/test_api_e2e.py)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.doc_blocks import example

REPO = Path(__file__).resolve().parents[1]
DOCS = [*sorted((REPO / "docs").glob("*.md")), REPO / "README.md"]
MARKER = re.compile(r"<!-- example: ([\w-]+) -->\s*$")


def blocks(path: Path) -> list[tuple[int, str | None]]:
    """(line number, example name or None) of every ```python block of ``path``: the name of
    the marker on the last non-blank line before the block."""
    out, prev = [], ""
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip().startswith("```python"):
            m = MARKER.search(prev)
            out.append((n, m.group(1) if m else None))
        if line.strip():
            prev = line
    return out


def test_every_python_block_in_the_docs_is_named_and_run_by_a_test() -> None:
    tests_text = "\n".join(p.read_text() for p in (REPO / "tests").rglob("*.py"))
    found = [(path.relative_to(REPO), n, name) for path in DOCS for n, name in blocks(path)]
    assert len(found) >= 9
    unnamed = [f"{p}:{n}" for p, n, name in found if name is None]
    assert not unnamed, f"python blocks without an <!-- example: NAME --> marker: {unnamed}"
    unrun = [f"{p}:{n} ({name})" for p, n, name in found if f'"{name}"' not in tests_text and f"example: {name} -->" not in tests_text]
    assert not unrun, f"examples no test reads by name: {unrun}"


def test_gymnasiums_two_forms_work_in_a_fresh_interpreter() -> None:
    """The block as written, then each of its two forms alone in an interpreter of its own (the
    second needs no ``import agentrl``: Gymnasium imports it)."""
    code = example(REPO / "docs" / "environments.md", "gym-forms")
    forms = [part for part in code.split("\n\n") if part.strip()]
    assert len(forms) == 2
    for snippet in (code, *forms):
        done = subprocess.run([sys.executable, "-c", snippet + "\nprint(type(env.unwrapped).__name__)\n"],
                              capture_output=True, text=True, timeout=120, cwd=REPO)
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.strip() == "CalcEnv", done.stdout


def test_the_tutorials_python_api_block_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The block's calls, overrides and summary attributes as written; the controller is a
    stand-in that records the recipe each call would run (no training here)."""
    from agentrl.engine import controller as controller_mod
    from agentrl.engine.common.summary import RunSummary

    ran: list[Any] = []

    class StandIn:
        def __init__(self, recipe: Any, **_: Any) -> None:
            self.recipe = recipe

        def run(self) -> RunSummary:
            ran.append(self.recipe)
            root = Path(self.recipe.resolved_run_dir())
            return RunSummary(root, self.recipe.learner.max_steps, self.recipe.learner.max_steps, root / "final", 0, 0, 0)

    monkeypatch.setattr(controller_mod, "Controller", StandIn)
    (tmp_path / "recipes").mkdir()
    shutil.copy(REPO / "recipes" / "tiny_calc.toml", tmp_path / "recipes" / "tiny_calc.toml")
    monkeypatch.chdir(tmp_path)
    exec(compile(example(REPO / "docs" / "tutorial.md", "python-api"), "python-api", "exec"), {})
    trained, evaluated = ran
    assert (trained.mode, trained.learner.lr) == ("sync", 5e-5)
    assert evaluated.mode == "eval" and evaluated.model.path == str(Path(trained.resolved_run_dir()) / "final")
