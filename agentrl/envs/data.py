"""Dataset rows for environments: synthetic tasks, local files and Hugging Face Hub datasets.

A *row* is a ``dict`` an episode is about (``env.reset(options={"row": row})``); every row has
at least ``"question"`` and ``"answer"``.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

from agentrl.errors import DataError

__all__ = ["load_rows", "REQUIRED_FIELDS", "SYNTHETIC_DEFAULT_ROWS"]

REQUIRED_FIELDS: tuple[str, ...] = ("question", "answer")
"""Fields every row must have (not missing, not None)."""

SYNTHETIC_DEFAULT_ROWS = 1000
"""Rows a synthetic source yields when ``limit`` is None."""

_FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


def load_rows(
    source: str,
    *,
    split: str = "train",
    fields: dict[str, str] | None = None,
    limit: int | None = None,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Load dataset rows.

    Args:
        source: where the rows come from —
            ``"synthetic:calc"``, ``"synthetic:linear"``, ``"synthetic:word"``,
            ``"synthetic:turns"``: generated
            problems with exact answers (see :mod:`agentrl.envs.synthetic`);
            a path ending in ``.jsonl``, ``.json`` or ``.parquet``: a local file, read with
            ``datasets.load_dataset("json" | "parquet", data_files=path)``;
            anything else: a Hugging Face Hub dataset name, optionally ``"name:config"``
            (``"openai/gsm8k:main"``).
        split: the Hub split to read. For synthetic sources it picks a disjoint stream of
            problems (``"train"`` and ``"test"`` do not share seeds). Ignored for local files.
        fields: our field name -> the dataset's column name, e.g.
            ``{"question": "problem", "answer": "solution"}``; unmapped fields keep their names.
            Every row is returned with all its columns plus the mapped names.
        limit: keep the first ``limit`` rows (file order); synthetic sources generate exactly
            ``limit`` rows (default :data:`SYNTHETIC_DEFAULT_ROWS`).
        seed: the generator seed of synthetic sources; files and Hub datasets are not shuffled.

    Raises:
        DataError: unknown synthetic task, missing or unreadable file, unknown Hub dataset, or a
            row without ``"question"``/``"answer"`` (the message names the source and row index).
    """
    if limit is not None and limit < 0:
        raise DataError(f"{source}: limit must be >= 0, got {limit}")
    if source.startswith("synthetic:"):
        return _synthetic(source, split, limit, seed)
    path = Path(source).expanduser()
    if path.suffix.lower() in _FILE_BUILDERS or path.exists():
        table = _load_file(path)
    else:
        table = _load_hub(source, split)
    if limit is not None:
        table = table.select(range(min(limit, len(table))))
    return _rows(source, table.to_list(), fields or {})


def _synthetic(source: str, split: str, limit: int | None, seed: int) -> list[dict[str, Any]]:
    from agentrl.envs.synthetic import SYNTHETIC_TASKS

    task = source.removeprefix("synthetic:")
    if task not in SYNTHETIC_TASKS:
        known = ", ".join(repr(k) for k in SYNTHETIC_TASKS)
        raise DataError(f"{source}: unknown synthetic task {task!r} (known: {known})")
    n = SYNTHETIC_DEFAULT_ROWS if limit is None else limit
    split_seed = seed if split == "train" else seed + zlib.crc32(split.encode()) + 1
    return SYNTHETIC_TASKS[task](n, split_seed)


def _load_file(path: Path) -> Any:
    import datasets

    if not path.exists():
        raise DataError(f"{path}: no such data file")
    if not path.is_file():
        raise DataError(f"{path}: not a data file (a .jsonl, .json or .parquet file is expected)")
    builder = _FILE_BUILDERS.get(path.suffix.lower())
    if builder is None:
        raise DataError(f"{path}: unsupported data file type {path.suffix!r} (use .jsonl, .json or .parquet)")
    try:
        return datasets.load_dataset(builder, data_files=str(path), split="train")
    except Exception as exc:  # DatasetGenerationError, pyarrow errors, JSON errors
        raise DataError(f"{path}: cannot read the data file: {type(exc).__name__}: {exc}") from exc


def _load_hub(name: str, split: str) -> Any:
    import datasets

    repo, _, config = name.partition(":")
    try:
        return datasets.load_dataset(repo, config or None, split=split)
    except Exception as exc:  # DatasetNotFoundError, connection errors, unknown split
        raise DataError(f"{name}: cannot load split {split!r} from the Hugging Face Hub: {type(exc).__name__}: {exc}") from exc


def _rows(source: str, raw: list[dict[str, Any]], fields: dict[str, str]) -> list[dict[str, Any]]:
    rows = []
    for i, row in enumerate(raw):
        out = dict(row)
        for ours, theirs in fields.items():
            out[ours] = row.get(theirs)
        for name in REQUIRED_FIELDS:
            if out.get(name) is None:
                col = fields.get(name, name)
                via = f" (mapped from column {col!r})" if col != name else ""
                raise DataError(f"{source}: row {i} has no field {name!r}{via}; its columns: {sorted(row)}")
        rows.append(out)
    return rows
