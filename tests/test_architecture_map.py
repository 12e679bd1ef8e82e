"""docs/architecture.md is the map of the package: every module of ``agentrl/`` has a line in it
(named by its file, its path inside its wing or package, or its package as a whole, ``pkg/``)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def named_in_the_map(text: str) -> set[str]:
    """Every name written in backticks in ``text``, line by line, split at spaces and commas."""
    names: set[str] = set()
    for line in text.splitlines():
        for quoted in re.findall(r"`([^`]+)`", line):
            names.update(part for part in re.split(r"[\s,]+", quoted) if part)
    return names


def ways_to_name(rel: Path) -> set[str]:
    """How the map may name module ``rel`` (a path under agentrl/): its file name, its path from
    any package above it, or any package above it as a whole (``pkg/``)."""
    parts = rel.parts
    names = {rel.name}
    for i in range(len(parts) - 1):
        names.add("/".join(parts[i:]))
        names.add("/".join(parts[: i + 1]) + "/")
        names.add(parts[i] + "/")
    return names


def test_every_module_has_a_line_in_the_architecture_map():
    names = named_in_the_map((REPO / "docs" / "architecture.md").read_text())
    modules = [p.relative_to(REPO / "agentrl") for p in (REPO / "agentrl").rglob("*.py") if p.name != "__init__.py"]
    assert len(modules) > 100
    missing = sorted(str(m) for m in modules if not ways_to_name(m) & names)
    assert missing == [], f"modules with no line in docs/architecture.md: {missing}"
