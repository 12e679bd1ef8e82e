"""What the end-to-end tests share: the `agentrl train` command line of the tiny recipe."""

from pathlib import Path

from agentrl.cli import train_command

REPO = Path(__file__).resolve().parents[2]


def train_cmd(run_dir: Path, model: Path, *overrides: str) -> list[str]:
    """``agentrl train recipes/tiny_calc.toml`` into ``run_dir`` with ``model``, plus one
    ``--set`` per override (``"section.key=value"``)."""
    return train_command(str(REPO / "recipes" / "tiny_calc.toml"), str(run_dir), str(model), *overrides)
