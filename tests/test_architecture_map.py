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


def wing_table(text: str) -> dict[str, set[str]]:
    """The map's table of the engine's wings (the table headed ``| wing | may import ...``): each
    wing (``name/``) and the wings it may import, as its rows write them (backticked names;
    "nothing" for none); the top's row is left out."""
    table: dict[str, set[str]] = {}
    inside = False
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.strip().startswith("|"):
            inside = False
        elif len(cells) == 2 and cells[0] == "wing" and cells[1].startswith("may import"):
            inside = True
        elif inside and len(cells) == 2 and re.fullmatch(r"`\w+/`", cells[0]):
            table[cells[0].strip("`/")] = set(re.findall(r"`(\w+)`", cells[1]))
    return table


def test_the_maps_wing_table_is_the_rule_the_import_test_enforces():
    from tests.test_imports import WING_IMPORTS

    table = wing_table((REPO / "docs" / "architecture.md").read_text())
    assert table == WING_IMPORTS


def test_the_wing_table_reader_sees_a_row_that_drifted():
    doc = ("| module | owns |\n| `recipe/` | `schema` |\n\n| wing | may import |\n| --- | --- |\n| `common/` | nothing |\n"
           "| `loop/` | `common`, `rewards` (says why) |\n| the top | every wing |\n")
    assert wing_table(doc) == {"common": set(), "loop": {"common", "rewards"}}
