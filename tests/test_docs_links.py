"""The docs errors a first-day user found (issue 36) stay fixed: every relative link in README.md and
docs/*.md names a file of the repository (README linked ../shared/DESIGN.md, outside it); every
benchmarks/RESULTS.md section the docs name by its title exists there; no install line points at
PyPI's `agentrl` (an unrelated project); every built-in environment id is in environments.md's
table (Turns-v0 was missing); a tool's ``ctx`` argument is explained where tools are described.
(The Python examples themselves, `await MathVerifier().verify` and the `load_rows` import among
them, run in tests/test_docs_examples.py.)"""

from __future__ import annotations

import re
from pathlib import Path

from agentrl.registration import BUILTIN_ENVS

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def _links(text: str) -> list[str]:
    """The targets of the markdown links ``[text](target)`` in ``text`` (code spans left out)."""
    text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    text = re.sub(r"`[^`\n]*`", "", text)
    return re.findall(r"\]\(([^)\s]+)\)", text)


def test_every_relative_link_names_a_file_of_the_repository() -> None:
    broken = []
    for doc in DOCS:
        for target in _links(doc.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a URL (http:, mailto:) or an anchor of the same page
            path = (doc.parent / target.split("#")[0]).resolve()
            if not path.exists() or not path.is_relative_to(REPO):
                broken.append(f"{doc.relative_to(REPO)}: {target}")
    assert broken == [], broken


def test_every_results_section_the_docs_name_exists() -> None:
    headings = [" ".join(line.lstrip("#").split()) for line in (REPO / "benchmarks" / "RESULTS.md").read_text().splitlines()
                if line.startswith("#")]
    named = []
    for doc in DOCS:
        for title in re.findall(r"RESULTS\.md\]?(?:\([^)]*\))?,?\s*\(?\"([^\"]+)\"", doc.read_text()):
            named.append((doc.relative_to(REPO), " ".join(title.split())))
    assert named, "no section of RESULTS.md named in the docs: the pattern went stale"
    missing = [(doc, title) for doc, title in named if not any(h.startswith(title) for h in headings)]
    assert missing == [], missing


def test_no_install_line_points_at_pypis_agentrl() -> None:
    bad = [f"{doc.relative_to(REPO)}: {m}" for doc in DOCS
           for m in re.findall(r"pip install +['\"]?agentrl\b[^\s`]*", doc.read_text())]
    assert bad == [], bad


def test_every_builtin_environment_is_in_the_environments_table() -> None:
    rows = re.findall(r"^\| `([^`]+)` \|", (REPO / "docs" / "environments.md").read_text(), re.MULTILINE)
    assert set(BUILTIN_ENVS) <= set(rows), sorted(set(BUILTIN_ENVS) - set(rows))


def test_a_tools_ctx_argument_is_explained() -> None:
    text = (REPO / "docs" / "environments.md").read_text()
    assert re.search(r"`ctx` is the environment that calls the tool", text)
