"""What a run does about its model before anything loads it: use it, build it or import it.

One decision for the run (:func:`agentrl.engine.prepare.prepare_model`) and for its dry run
(``agentrl check --dry-run``), so that the two never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = ["ModelPlan", "plan_model"]


@dataclass(frozen=True)
class ModelPlan:
    """``action``: ``"use"`` (load ``path`` as it is: a folder, or a hub id when no such folder
    exists), ``"build"`` (build a model of kind ``build`` at ``path`` first) or ``"import"``
    (import the packaged model ``source`` to ``path`` first)."""

    action: Literal["use", "build", "import"]
    path: str
    source: str | None = None


def plan_model(path: str, build: str | None = None, import_: str | None = None) -> ModelPlan:
    """The plan for a recipe's ``[model]``: with ``build`` or ``import_`` given, the model is
    created at ``path`` when ``path`` is missing or an empty folder; otherwise it is used."""
    p = Path(path)
    created = p.exists() and (not p.is_dir() or any(p.iterdir()))
    if build is not None and not created:
        return ModelPlan("build", path, build)
    if import_ is not None and not created:
        return ModelPlan("import", path, import_)
    return ModelPlan("use", path)
