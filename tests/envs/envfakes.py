"""Test helpers for tests/envs: a fake sandbox at the ``agentrl.sandbox`` seam (same contract, no processes)."""

from __future__ import annotations

import contextlib
import io
import traceback
from dataclasses import dataclass
from typing import Any, Callable

import anyio

ROW = {"question": "Compute 347*58+91.", "answer": "20217"}


@dataclass(frozen=True)
class FakeResult:
    """Mirrors ``agentrl.sandbox.base.ExecResult``."""

    stdout: str
    stderr: str = ""
    exit_code: int | None = 0
    timed_out: bool = False
    memory_exceeded: bool = False
    wall_s: float = 0.001
    stdout_truncated: bool = False
    stderr_truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.memory_exceeded


def exec_in_process(code: str) -> FakeResult:
    """Run trusted test code in this process, capturing stdout and the traceback."""
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code, "<code>", "exec"), {})
    except Exception:
        return FakeResult(out.getvalue(), traceback.format_exc(limit=-1), exit_code=1)
    return FakeResult(out.getvalue())


class FakeSandbox:
    """``run`` answers with ``reply(code)`` (default: exec in process) or raises ``error``."""

    def __init__(self, reply: Callable[[str], Any] | None = None, error: Exception | None = None, hang: bool = False):
        self.reply = reply or exec_in_process
        self.error = error
        self.hang = hang
        self.calls: list[tuple[str, float | None, int | None]] = []
        self.closed = 0

    async def run(self, code: str, *, timeout_s: float | None = None, memory_mb: int | None = None) -> Any:
        self.calls.append((code, timeout_s, memory_mb))
        await anyio.sleep(0)
        if self.hang:
            await anyio.sleep_forever()
        if self.error is not None:
            raise self.error
        return self.reply(code)

    async def aclose(self) -> None:
        self.closed += 1
