"""Tests of the scripts in benchmarks/ (their pure parts, their verdicts on committed records, and
each script run small on this CPU)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

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


TINY_QWEN2 = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 32, "intermediate_size": 64,
    "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2, "vocab_size": 128,
    "tie_word_embeddings": True, "max_position_embeddings": 256,
}
"""A Qwen2 architecture small enough for the GPU check scripts to run on this CPU in seconds."""


def run_gpu_check_on_cpu(name: str, tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """Run ``benchmarks/<name>.py`` on this CPU with :data:`TINY_QWEN2` and 3 short rows (plus
    ``args``); its process (which must have succeeded) and its JSON report."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY_QWEN2))
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH / f"{name}.py"), "--config", str(config), "--rows", "3", "--min-len", "8",
         "--max-len", "24", *args, "--out", str(out)],
        capture_output=True, text=True, timeout=300, cwd=BENCH.parent,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc, json.loads(out.read_text())
