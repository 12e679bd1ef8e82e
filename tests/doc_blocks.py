"""The marked code examples of the docs, as tests read them: the ```python block that follows
``<!-- example: NAME -->`` in a Markdown file (tests/test_docs_examples.py checks that every
block has a marker and that some test runs it)."""

from __future__ import annotations

import re
from pathlib import Path

DOCS_DIR = Path(__file__).resolve().parents[1] / "docs"


def example(path: Path, name: str) -> str:
    """The ```python block after ``<!-- example: name -->`` in ``path``."""
    match = re.search(rf"<!-- example: {name} -->\s*```python\n(.*?)```", path.read_text(), re.DOTALL)
    assert match is not None, f"no example {name!r} in {path}"
    return match.group(1)
