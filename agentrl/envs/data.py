"""Dataset rows for environments: synthetic tasks, local files and Hugging Face Hub datasets.

A *row* is a ``dict`` an episode is about (``env.reset(options={"row": row})``). Every row has an
``"answer"`` and a prompt: a ``"question"`` (text), or ``"messages"``, a conversation
(``[{"role": "system" | "user" | "assistant", "content": str}, ...]``, TRL's conversational
format). The prompt is the conversation up to and excluding a final assistant turn: a row whose
``messages`` end with the assistant's reply keeps the messages before it as ``"messages"``, and
that reply becomes its ``"answer"`` when the row has none (the reference answer). A row of
``messages`` without a question gets ``"question"`` = the content of its prompt's last user
message, so that every environment can use it; :class:`~agentrl.envs.tool_env.ToolEnv` starts
its episodes from the whole prompt conversation.

Local or hub is decided without the network: ``synthetic:...`` is generated; a path with a data
file suffix (``.jsonl``, ``.json``, ``.csv``, ``.parquet``), a path that exists, or one spelled
like a local path (``./x``, ``../x``, ``/x``, ``~/x``, ``a/b/c``, another suffix) is a local
file; anything else (``name``, ``owner/name``, ``owner/name:config``) is a Hub dataset, read
from the local Hugging Face cache only (no network retries) while ``HF_HUB_OFFLINE`` or
``HF_DATASETS_OFFLINE`` is set or the Hub's host does not answer.

Errors name where: ``data/train.jsonl: line 7: not valid JSON (...)``,
``data/train.jsonl: row 3 (line 3): field 'answer' is null``,
``data/chat.parquet: row 2: messages[1]: 'content' is missing``. Rows and lines count from 1,
messages from 0 (as Python indexes the list).
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agentrl.errors import DataError

__all__ = ["load_rows", "REQUIRED_FIELDS", "PROMPT_FIELDS", "SYNTHETIC_DEFAULT_ROWS", "is_local_source"]

REQUIRED_FIELDS: tuple[str, ...] = ("answer",)
"""Fields every row must have (not missing, not None), besides a prompt (:data:`PROMPT_FIELDS`)."""

PROMPT_FIELDS: tuple[str, ...] = ("question", "messages")
"""A row's prompt: one of these, not missing and not None."""

SYNTHETIC_DEFAULT_ROWS = 1000
"""Rows a synthetic source yields when ``limit`` is None."""

FILE_TYPES: tuple[str, ...] = (".jsonl", ".json", ".csv", ".parquet")
"""Suffixes of the local data files agentrl reads."""

_OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


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
            ``"synthetic:turns"``, ``"synthetic:math"``, ``"synthetic:math_ood"``: generated
            problems with exact answers (see :mod:`agentrl.envs.synthetic`);
            a local file (:func:`is_local_source`): ``.jsonl`` (one JSON object a line),
            ``.json`` (a list of objects, or JSON lines), ``.csv`` (a header row; values are
            strings), ``.parquet``;
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
        DataError: unknown synthetic task, missing or unreadable file (naming the file and the
            1-based line of a broken JSON line), a Hub dataset that cannot be loaded (at once
            when offline), or a row without an answer or a prompt (naming the source, the
            1-based row, its line in a JSON lines file, and the field).
    """
    if limit is not None and limit < 0:
        raise DataError(f"{source}: limit must be >= 0, got {limit}")
    if source.startswith("synthetic:"):
        return _synthetic(source, split, limit, seed)
    if is_local_source(source):
        raw, lines = _load_file(Path(source).expanduser(), limit)
    else:
        raw, lines = _load_hub(source, split, limit), None
    return _rows(source, raw, fields or {}, lines)


def is_local_source(source: str) -> bool:
    """Whether ``source`` names a local file (decided without the network): it exists, has a
    data file suffix, or is spelled like a path rather than a Hub id (``./``, ``../``, ``/``,
    ``~``, more than one ``/``, a backslash, or any other suffix)."""
    path = Path(source).expanduser()
    if path.exists() or path.suffix.lower() in FILE_TYPES:
        return True
    repo = source.partition(":")[0] if not source.startswith(("/", "~", ".")) else source
    return (
        source.startswith(("./", "../", "/", "~", ".\\"))
        or "\\" in source
        or repo.count("/") > 1
        or bool(Path(repo).suffix)
    )


def _offline() -> str | None:
    """The variable that makes this process offline for the Hub, or None."""
    for name in _OFFLINE_VARS:
        if os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on"):
            return name
    return None


def _synthetic(source: str, split: str, limit: int | None, seed: int) -> list[dict[str, Any]]:
    from agentrl.envs.synthetic import SYNTHETIC_TASKS

    task = source.removeprefix("synthetic:")
    if task not in SYNTHETIC_TASKS:
        known = ", ".join(repr(k) for k in SYNTHETIC_TASKS)
        raise DataError(f"{source}: unknown synthetic task {task!r} (known: {known})")
    n = SYNTHETIC_DEFAULT_ROWS if limit is None else limit
    generate = SYNTHETIC_TASKS[task]
    if getattr(generate, "takes_split", False):  # splits disjoint by question (agentrl.envs.math_tasks)
        return generate(n, seed, split=split)
    split_seed = seed if split == "train" else seed + zlib.crc32(split.encode()) + 1
    return generate(n, split_seed)


def _load_file(path: Path, limit: int | None) -> tuple[list[Any], list[int] | None]:
    """The raw rows of a local file (at most ``limit``) and, for JSON lines, each row's 1-based
    line number (None for other formats)."""
    kinds = ", ".join(FILE_TYPES)
    if not path.exists():
        hint = "" if path.suffix.lower() in FILE_TYPES else f" (a local data file ends in {kinds}; a Hub dataset is named like 'owner/name')"
        raise DataError(f"{path}: no such data file{hint}")
    if not path.is_file():
        raise DataError(f"{path}: a directory, not a data file (give a {kinds} file)")
    suffix = path.suffix.lower()
    if suffix not in FILE_TYPES:
        raise DataError(f"{path}: unsupported data file type {suffix or '(no suffix)'!r} (use {kinds})")
    try:
        if suffix == ".parquet":
            import pyarrow.parquet as pq

            table = pq.read_table(path)
            if limit is not None:
                table = table.slice(0, limit)
            return table.to_pylist(), None
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: cannot read the data file: {type(exc).__name__}: {exc}") from exc
    except Exception as exc:  # pyarrow.ArrowInvalid: not a parquet file
        raise DataError(f"{path}: cannot read the Parquet file: {type(exc).__name__}: {exc}") from exc
    if suffix == ".csv":
        rows = list(csv.DictReader(text.splitlines()))
        return (rows if limit is None else rows[:limit]), None
    return parse_json_rows(path, text, limit)


def parse_json_rows(path: Path, text: str, limit: int | None = None) -> tuple[list[Any], list[int] | None]:
    """The rows of a JSON data file's ``text`` (at most ``limit``): a ``.json`` file holding a
    list is parsed whole (line numbers: None); anything else is JSON lines, one value a line,
    blank lines skipped, with each row's 1-based line number.

    Raises:
        DataError: text that is not valid JSON, naming ``path`` and the 1-based line (and column).
    """
    if path.suffix.lower() == ".json" and text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}: line {exc.lineno}, column {exc.colno}: not valid JSON ({exc.msg})") from None
        return (rows if limit is None else rows[:limit]), None
    return _json_lines(path, text, limit)


def row_where(source: str, index: int, lines: list[int] | None) -> str:
    """Where the row at 0-based ``index`` of ``source`` is, for an error: ``"SOURCE: row N"``
    with N 1-based, plus ``" (line L)"`` when ``lines`` (each row's 1-based line, from
    :func:`parse_json_rows`) is given."""
    return f"{source}: row {index + 1}" + (f" (line {lines[index]})" if lines is not None else "")


def _json_lines(path: Path, text: str, limit: int | None) -> tuple[list[Any], list[int]]:
    rows: list[Any] = []
    lines: list[int] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if limit is not None and len(rows) >= limit:
            break
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}: line {number}: not valid JSON ({exc.msg} at column {exc.colno}): {line[:80]!r}") from None
        lines.append(number)
    return rows, lines


def _load_hub(name: str, split: str, limit: int | None) -> list[Any]:
    """A Hub dataset's rows. Offline (``HF_HUB_OFFLINE``/``HF_DATASETS_OFFLINE``, or the Hub's
    host not answering within 3 s) only the local Hugging Face cache is read: no retries."""
    import datasets

    from agentrl.models.loading import hub_reachable

    offline = _offline()
    if offline is None and not hub_reachable():
        offline = "the Hugging Face Hub is not reachable from here"
    elif offline is not None:
        offline = f"{offline} is set"
    repo, _, config = name.partition(":")
    bars = not datasets.are_progress_bars_disabled()
    try:
        if bars:  # agentrl's console has its own progress: no "Generating train split" bars beside it
            datasets.disable_progress_bars()
        with _offline_mode(offline is not None):
            table = datasets.load_dataset(repo, config or None, split=split)
    except Exception as exc:  # DatasetNotFoundError, connection errors, unknown split, not cached
        if offline is not None:
            raise DataError(
                f"{name}: no such local file, and not in the Hugging Face cache while offline ({offline}): give a local "
                f".jsonl/.json/.csv/.parquet file, or load the Hub dataset once while online ({type(exc).__name__})"
            ) from exc
        raise DataError(f"{name}: cannot load split {split!r} from the Hugging Face Hub: {type(exc).__name__}: {exc}") from exc
    finally:
        if bars:
            datasets.enable_progress_bars()
    if limit is not None:
        table = table.select(range(min(limit, len(table))))
    return table.to_list()


@contextlib.contextmanager
def _offline_mode(on: bool) -> Iterator[None]:
    """While ``on``: datasets and huggingface_hub read their caches only (their offline switches,
    read once at import, flipped for the call and restored)."""
    if not on:
        yield
        return
    import datasets
    from huggingface_hub import constants

    saved = datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE = saved


def _conversation_error(value: Any) -> str | None:
    """What is wrong with ``value`` as a ``messages`` conversation (naming the message and its
    key), or None when it is a non-empty list of ``{"role": str, "content": str}``."""
    if not isinstance(value, list) or not value:
        return f"field 'messages' must be a non-empty list of {{'role': str, 'content': str}}, got {str(value)[:80]!r}"
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            return f"messages[{i}]: expected an object with 'role' and 'content', got {type(m).__name__} {str(m)[:60]!r}"
        for key in ("role", "content"):
            if m.get(key) is None:
                return f"messages[{i}]: {key!r} is {'null' if key in m else 'missing'} (its keys: {sorted(m)})"
            if not isinstance(m[key], str):
                return f"messages[{i}]: {key!r} must be a string, got {type(m[key]).__name__} {str(m[key])[:60]!r}"
        if not m["role"]:
            return f"messages[{i}]: 'role' is empty"
    return None


def _prompt_and_reference(out: dict[str, Any], where: str) -> None:
    """Check ``out["messages"]`` and split off a final assistant turn: the messages before it are
    the prompt (``out["messages"]``); its content becomes ``out["answer"]`` when the row has
    none. Sets ``out["question"]`` (when missing) to the prompt's last user message."""
    conversation = out["messages"]
    wrong = _conversation_error(conversation)
    if wrong is not None:
        raise DataError(f"{where}: {wrong}")
    prompt = [dict(m) for m in conversation]
    reply = prompt.pop() if prompt[-1]["role"] == "assistant" else None
    if reply is not None and out.get("answer") is None:
        out["answer"] = reply["content"]
    if not any(m["role"] == "user" for m in prompt):
        before = " before its final assistant turn" if reply is not None else ""
        raise DataError(f"{where}: field 'messages' has no user message{before} (roles: {[m['role'] for m in conversation]})")
    out["messages"] = prompt
    if out.get("question") is None:
        out["question"] = [m["content"] for m in prompt if m["role"] == "user"][-1]


def _rows(source: str, raw: list[Any], fields: dict[str, str], lines: list[int] | None) -> list[dict[str, Any]]:
    rows = []
    for i, row in enumerate(raw):
        where = row_where(source, i, lines)
        if not isinstance(row, dict):
            raise DataError(f"{where}: expected an object with fields, got {type(row).__name__} {str(row)[:60]!r}")
        out = dict(row)
        for ours, theirs in fields.items():
            out[ours] = row.get(theirs)

        def missing(name: str) -> str:
            col = fields.get(name, name)
            via = f" (mapped from column {col!r})" if col != name else ""
            present = sorted(k for k, v in row.items() if v is not None)
            nulls = sorted(k for k, v in row.items() if v is None)
            state = "is null" if col in row else "is missing"
            return (f"{where}: field {name!r}{via} {state}; its fields with values: {present}"
                    + (f" (null: {nulls})" if nulls else ""))

        if out.get("messages") is not None:
            _prompt_and_reference(out, where)
        elif out.get("question") is None:
            raise DataError(missing("question") + " (a row's prompt is a 'question' or a 'messages' conversation)")
        for name in REQUIRED_FIELDS:
            if out.get(name) is None:
                raise DataError(missing(name) + (" (nor do its 'messages' end with an assistant turn, the reference answer)"
                                                 if out.get("messages") is not None and name == "answer" else ""))
        rows.append(out)
    return rows
