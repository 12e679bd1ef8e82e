"""Append-only audit logs: what each component did, written by that component, never rewound.

``metrics.jsonl`` and ``trained.jsonl`` are the controller's account of a run, and a resume
rewrites them to the checkpoint it starts from. The audit logs are the evidence beside that
account, kept in ``RUN_DIR/audit/``:

- ``learner.jsonl``: written by learner rank 0 after every RL optimizer step, one record
  ``{"step", "pid", "time", "samples": [{"id", "prompt_sha1", "tokens"}]}`` — ``step`` the learner
  step just completed (its new version), ``id`` the label the sample came with (``"p12/3"``:
  group ``p12``, sample 3; ``null`` when unlabelled), ``prompt_sha1`` the first 16 hex digits of
  the SHA-1 of the token ids before the first trained token (the rendered prompt the sample was
  about: the dataset row the learner actually saw), ``tokens`` the sample's length;
- ``episodes.jsonl``: written by the rollout workers, one record per finished episode
  ``{"id", "prompt", "status", "reward", "generated", "versions", "pid", "time"}`` — ``prompt``
  the prompt index, ``generated`` the tokens the model wrote, ``versions`` the ``[oldest,
  newest]`` weight versions that wrote them (``null`` when none);
- ``set_aside.jsonl``: written by the RL loop under ``algo.dynamic_sampling = "refill"``, one
  record per group set aside as carrying no learning signal ``{"prompt", "group", "reason",
  "reward", "version", "pid", "time"}`` — ``reason`` ``"solved"`` or ``"failed"``, ``reward`` the
  group's (equal) reward, ``version`` the learner's version when it was set aside.

A record is one ``write(2)`` on a file opened with ``O_APPEND``, so several processes can share a
file and a killed process leaves at most its last line torn; records of a run that was killed
and resumed stay, with the ``pid`` that wrote them. Nothing in the engine reads these files back:
they exist to be checked (by tests, and by people).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["AuditLog", "episodes_audit_path", "learner_audit_path", "prompt_sha1", "read_audit", "set_aside_audit_path"]


def learner_audit_path(run_dir: str | os.PathLike[str]) -> Path:
    """``RUN_DIR/audit/learner.jsonl``."""
    return Path(run_dir) / "audit" / "learner.jsonl"


def episodes_audit_path(run_dir: str | os.PathLike[str]) -> Path:
    """``RUN_DIR/audit/episodes.jsonl``."""
    return Path(run_dir) / "audit" / "episodes.jsonl"


def set_aside_audit_path(run_dir: str | os.PathLike[str]) -> Path:
    """``RUN_DIR/audit/set_aside.jsonl``."""
    return Path(run_dir) / "audit" / "set_aside.jsonl"


class AuditLog:
    """An append-only JSON-lines file. ``fsync`` (default off) also forces each record to disk
    (a killed process loses nothing either way: a written record is in the page cache).

    Opening a file whose last line was torn (a writer killed mid-line) ends that line first, so
    the records appended after it stay readable."""

    def __init__(self, path: str | os.PathLike[str], fsync: bool = False) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync
        if self.path.exists() and self.path.stat().st_size:
            with self.path.open("rb") as f:
                f.seek(-1, os.SEEK_END)
                torn = f.read(1) != b"\n"
            if torn:
                self._write(b"\n")

    def _write(self, data: bytes) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)

    def append(self, record: dict[str, Any]) -> None:
        """Write ``record`` plus ``pid`` and ``time`` (Unix seconds) as one line, in one write."""
        self._write((json.dumps({**record, "pid": os.getpid(), "time": time.time()}) + "\n").encode())


def prompt_sha1(tokens: Sequence[int], loss_mask: Sequence[int]) -> str:
    """First 16 hex digits of the SHA-1 of ``tokens`` before the first position where
    ``loss_mask`` is 1 (all of ``tokens`` when none is): the same prompt gives the same digest."""
    end = next((i for i, m in enumerate(loss_mask) if m), len(tokens))
    return hashlib.sha1(",".join(map(str, tokens[:end])).encode()).hexdigest()[:16]


def read_audit(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of an audit file in the order written (a torn last line is skipped; a
    missing file has none)."""
    p = Path(path)
    if not p.exists():
        return []
    out = []
    for line in p.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out
