"""benchmarks/checkpoint.py runs its three arms on the tiny model and prints its table (the
figures themselves are the benchmark's business, not a test's)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_checkpoint_benchmark_runs_every_arm_and_leaves_no_checkpoint(tmp_path):
    where = tmp_path / "ckpts"
    out = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "checkpoint.py"), "--repeats", "1", "--samples", "4", "--max-len", "64",
         "--dir", str(where)],
        capture_output=True, text=True, timeout=600, cwd=REPO,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    table = out.stdout[out.stdout.index("| arm |"):]
    for row in ("| none (baseline) |", "| wait |", "| background |"):
        assert row in table, table
    assert "The checkpoint's cost in the background / waited for" in out.stdout
    assert not list(where.glob("ckpt_*")), "every round's checkpoint is removed"
