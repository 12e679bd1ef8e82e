"""Where metric records go besides ``metrics.jsonl``: TensorBoard and Weights & Biases.

A sink receives every non-event record (``kind`` is ``step``, ``sft``, ``eval``...) and writes
its numeric fields as ``<kind>/<field>`` scalars against the record's ``step`` (or ``version``).
Each kind has its own x-axis, so SFT steps and RL steps never collide.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from agentrl.errors import ConfigError

__all__ = ["MetricSink", "TensorBoardSink", "WandbSink", "numeric_fields"]


def numeric_fields(record: dict[str, Any]) -> dict[str, float]:
    """The int/float fields of a record (booleans, strings and nested values left out)."""
    return {k: v for k, v in record.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


class MetricSink(Protocol):
    """Receives metric records."""

    def write(self, kind: str, step: int, values: dict[str, float]) -> None:
        """Record ``values`` of a ``kind`` record at x-axis position ``step``."""

    def close(self) -> None:
        """Flush and release."""


class TensorBoardSink:
    """Scalars in ``log_dir`` (``torch.utils.tensorboard``; needs the ``tensorboard`` package)."""

    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(log_dir))

    def write(self, kind: str, step: int, values: dict[str, float]) -> None:
        for key, value in values.items():
            self._writer.add_scalar(f"{kind}/{key}", value, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbSink:
    """A Weights & Biases run. ``mode = "offline"`` writes it under ``directory`` for a later
    ``wandb sync``; ``online`` needs ``WANDB_API_KEY`` or a ``wandb login``."""

    def __init__(
        self, *, project: str, directory: Path, name: str, config: dict[str, Any],
        entity: str | None = None, mode: str = "online", tags: list[str] | None = None,
    ) -> None:
        try:
            import wandb
        except ImportError as exc:
            raise ConfigError(
                "wandb.project is set but the wandb package is not installed: pip install wandb"
            ) from exc
        directory.mkdir(parents=True, exist_ok=True)
        self._wandb = wandb
        self.run = wandb.init(
            project=project, entity=entity, name=name, mode=mode, dir=str(directory),
            config=config, tags=tags or None, reinit="finish_previous",
        )
        self._kinds: set[str] = set()

    def write(self, kind: str, step: int, values: dict[str, float]) -> None:
        if kind not in self._kinds:  # each kind on its own x-axis
            self.run.define_metric(f"{kind}/step")
            self.run.define_metric(f"{kind}/*", step_metric=f"{kind}/step")
            self._kinds.add(kind)
        self.run.log({**{f"{kind}/{k}": v for k, v in values.items()}, f"{kind}/step": step})

    def close(self) -> None:
        self.run.finish()
