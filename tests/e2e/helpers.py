"""What the end-to-end tests share: the `agentrl train` command line of the tiny recipe."""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def train_cmd(run_dir: Path, model: Path, *overrides: str) -> list[str]:
    """``agentrl train recipes/tiny_calc.toml`` into ``run_dir`` with ``model``, plus one
    ``--set`` per override (``"section.key=value"``)."""
    cmd = [
        sys.executable, "-m", "agentrl.cli", "train", str(REPO / "recipes" / "tiny_calc.toml"),
        "--set", f"run_dir='{run_dir}'",
        "--set", f"model.path='{model}'",
    ]
    for item in overrides:
        cmd += ["--set", item]
    return cmd
