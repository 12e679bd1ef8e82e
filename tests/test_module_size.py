"""No module in agentrl/ is over 600 lines unless it is one cohesive thing whose docstring says
why (a paragraph beginning "Why one module of this size")."""

from __future__ import annotations

import ast
from pathlib import Path

from agentrl.envs import pyast

PACKAGE = Path(__file__).resolve().parents[1] / "agentrl"
MAX_LINES = 600
REASON = "Why one module of this size"


def oversized(package: Path) -> list[str]:
    """Modules under ``package`` over MAX_LINES lines whose docstring gives no reason."""
    out = []
    for path in sorted(package.rglob("*.py")):
        text = path.read_text()
        lines = text.count("\n")
        if lines > MAX_LINES and REASON not in (ast.get_docstring(pyast.parse(text)) or ""):
            out.append(f"{path.relative_to(package.parent)}: {lines} lines")
    return out


def test_no_module_is_over_600_lines_without_saying_why():
    assert oversized(PACKAGE) == []


def test_the_size_rule_finds_a_long_module_and_accepts_a_reason(tmp_path):
    (tmp_path / "long.py").write_text('"""A module."""\n' + "x = 1\n" * MAX_LINES)
    (tmp_path / "why.py").write_text(f'"""A module.\n\n{REASON}: one thing."""\n' + "x = 1\n" * MAX_LINES)
    (tmp_path / "short.py").write_text('"""A module."""\nx = 1\n')
    assert oversized(tmp_path) == [f"{tmp_path.name}/long.py: {MAX_LINES + 1} lines"]
