"""Tests of the scripts in benchmarks/ (their pure parts, their verdicts on committed records, and
each script run small on this CPU)."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
"""The benchmarks folder."""


@contextlib.contextmanager
def benchmark_module(name: str) -> Iterator[ModuleType]:
    """``benchmarks/<name>.py`` loaded as a module of its own (``<name>_under_test``), with
    benchmarks/ on ``sys.path`` for its own imports (``_measure``); both undone afterwards."""
    added = str(BENCH) not in sys.path
    if added:
        sys.path.insert(0, str(BENCH))
    module_name = f"{name}_under_test"
    try:
        spec = importlib.util.spec_from_file_location(module_name, BENCH / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(module_name, None)
        if added and str(BENCH) in sys.path:
            sys.path.remove(str(BENCH))
