"""What a run does about its model before anything loads it: use it, build it or import it.

One decision for the run (:func:`agentrl.engine.prepare.prepare_model`) and for its dry run
(``agentrl check --dry-run``), so that the two never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = ["ModelPlan", "looks_like_hub_id", "plan_model"]


def looks_like_hub_id(path: str) -> bool:
    """Whether ``path`` is spelled as a hub id (``org/name`` or ``name``) rather than a local
    folder: nothing of that name exists here, it does not start with ``/``, ``.`` or ``~``, holds
    no backslash and at most one ``/``. ``./org/name`` is the same name as a local folder."""
    if not path or Path(path).expanduser().exists():
        return False
    return not path.startswith(("/", ".", "~")) and "\\" not in path and path.count("/") <= 1


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
