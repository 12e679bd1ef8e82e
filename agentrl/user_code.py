"""The user's own code: modules a recipe names as ``module:Name`` (an environment, an agent, SFT
demonstrations...) found beside the recipe or in the current directory, in this process and in
every Ray worker.

- :func:`use_user_code` (called by ``agentrl train/check/eval`` and by :mod:`agentrl.api`) puts
  the recipe's directory and the current directory at the front of ``sys.path`` and remembers
  them.
- :func:`user_runtime_env` gives the Ray job's ``runtime_env`` for them: the modules the recipe
  names that live in those directories travel to every node as ``py_modules`` (a node started in
  another directory, or on another machine, imports them from Ray's copy), and the directories go
  on the workers' ``PYTHONPATH`` (their sibling modules, where the path exists on the node).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["referenced_modules", "shipped_modules", "use_user_code", "user_code_dirs", "user_runtime_env"]

_DIRS: list[Path] = []
"""The directories :func:`use_user_code` put on ``sys.path``, in order."""

_REFERENCE = re.compile(r"^([A-Za-z_]\w*)(?:\.[A-Za-z_]\w*)*:[A-Za-z_][\w.-]*$")
"""``module:Name`` / ``package.module:Name`` (group 1: the top-level module)."""

_NOT_SHIPPED = {"agentrl"}
"""Top-level modules never shipped: agentrl itself is installed on every node."""


def use_user_code(recipe_path: str | os.PathLike[str] | None) -> list[Path]:
    """Put the directory of ``recipe_path`` (when given) and the current directory at the front
    of ``sys.path`` (each once) and remember them for :func:`user_runtime_env`; the directories."""
    dirs = []
    if recipe_path is not None:
        dirs.append(Path(recipe_path).expanduser().resolve().parent)
    dirs.append(Path.cwd().resolve())
    for d in reversed(dirs):
        text = str(d)
        if text in sys.path:
            sys.path.remove(text)
        sys.path.insert(0, text)
    for d in dirs:
        if d not in _DIRS:
            _DIRS.append(d)
    return list(dirs)


def user_code_dirs() -> list[Path]:
    """The directories :func:`use_user_code` added so far (none when the engine is used directly)."""
    return list(_DIRS)


def referenced_modules(values: Any) -> set[str]:
    """The top-level module names of every ``module:Name`` string anywhere in ``values`` (a
    recipe's ``model_dump()``: nested dicts and lists)."""
    found: set[str] = set()

    def walk(v: Any) -> None:
        if isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x)
        elif isinstance(v, str):
            m = _REFERENCE.match(v.strip())
            if m:
                found.add(m.group(1))

    walk(values)
    return found


def shipped_modules(modules: Iterable[str], dirs: Iterable[Path]) -> list[Path]:
    """The file (``m.py``) or package folder (``m/``) of each of ``modules`` found in ``dirs``
    (the first directory that has it wins; modules found nowhere there, and agentrl, are left
    out: they are installed)."""
    dirs = list(dirs)
    out: list[Path] = []
    for name in sorted(set(modules) - _NOT_SHIPPED):
        for d in dirs:
            file, package = d / f"{name}.py", d / name
            if file.is_file():
                out.append(file)
                break
            if package.is_dir() and (package / "__init__.py").is_file():
                out.append(package)
                break
    return out


def user_runtime_env(recipe_values: Any, dirs: Iterable[Path] | None = None) -> dict[str, Any]:
    """The Ray job ``runtime_env`` entries that bring the user's code to every worker: the
    modules ``recipe_values`` names that live in ``dirs`` (default: :func:`user_code_dirs`) as
    ``py_modules``, and ``dirs`` on ``PYTHONPATH`` (after this process's own). Empty when there
    are no user directories."""
    dirs = list(_DIRS if dirs is None else dirs)
    if not dirs:
        return {}
    env: dict[str, Any] = {}
    modules = shipped_modules(referenced_modules(recipe_values), dirs)
    if modules:
        env["py_modules"] = [str(m) for m in modules]
    path = [str(d) for d in dirs] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
    env["env_vars"] = {"PYTHONPATH": os.pathsep.join(path)}
    return env
