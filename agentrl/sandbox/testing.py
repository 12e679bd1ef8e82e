"""Sandbox test doubles: the :class:`~agentrl.sandbox.base.Sandbox` contract without isolation,
for unit tests of environments, tools and rollouts (trusted test code only: nothing here confines
what the code does).

- :class:`FakeSandbox`: ``run`` answers with a function of the code (default: ``exec`` in this
  process), raises a given error, or never answers; it records every call.
- :class:`FakeSessionSandbox`: the same, plus ``session()`` (:class:`FakeSession`, one namespace
  for every cell in this process).
- :class:`SubprocessSandbox`: a plain ``python -I -S`` subprocess per run, no ``session()``.

Their results are :class:`FakeResult` (the fields of :class:`~agentrl.sandbox.base.ExecResult`
with defaults) and :class:`FakeSessionResult`.
"""

from __future__ import annotations

import contextlib
import io
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio

__all__ = [
    "FakeResult",
    "FakeSandbox",
    "FakeSession",
    "FakeSessionResult",
    "FakeSessionSandbox",
    "SubprocessSandbox",
    "exec_in_process",
]


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


class SubprocessSandbox:
    """Runs code in a plain ``python -I -S`` subprocess (no isolation: trusted test code only).
    No ``session()``: ToolEnv keeps state by replay."""

    def __init__(self) -> None:
        self.codes: list[str] = []
        self.timeouts: list[float | None] = []

    async def run(self, code: str, *, timeout_s: float | None = None, memory_mb: int | None = None) -> FakeResult:
        import sys
        import time

        self.codes.append(code)
        self.timeouts.append(timeout_s)
        start = time.monotonic()
        with anyio.move_on_after(timeout_s or 10.0) as scope:
            proc = await anyio.run_process([sys.executable, "-I", "-S", "-c", code], check=False)
        if scope.cancelled_caught:
            return FakeResult("", exit_code=None, timed_out=True, wall_s=time.monotonic() - start)
        return FakeResult(
            proc.stdout.decode(), proc.stderr.decode(), exit_code=proc.returncode, wall_s=time.monotonic() - start
        )

    async def aclose(self) -> None:
        pass


@dataclass(frozen=True)
class FakeSessionResult(FakeResult):
    state_lost: bool = False


class FakeSession:
    """A notebook-like session in this process: one namespace for every cell; a cell that
    contains ``LOSE_STATE`` "kills the interpreter" (result ``state_lost``, namespace cleared)."""

    def __init__(self, owner: FakeSessionSandbox, memory_mb: int | None) -> None:
        self.owner = owner
        self.memory_mb = memory_mb
        self.namespace: dict[str, Any] = {}
        self.cells: list[str] = []
        self.entered = self.exited = False

    async def __aenter__(self) -> FakeSession:
        self.entered = True
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.exited = True

    async def run(self, code: str, *, timeout_s: float | None = None, memory_mb: int | None = None) -> FakeSessionResult:
        assert self.entered and not self.exited
        self.cells.append(code)
        await anyio.sleep(0)
        if "LOSE_STATE" in code:
            self.namespace.clear()
            return FakeSessionResult("", exit_code=None, timed_out=True, state_lost=True)
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):
                exec(compile(code, f"cell{len(self.cells)}.py", "exec"), self.namespace)
        except SystemExit as exc:
            return FakeSessionResult(out.getvalue(), exit_code=int(exc.code or 0))
        except Exception:
            return FakeSessionResult(out.getvalue(), traceback.format_exc(limit=-1), exit_code=1)
        return FakeSessionResult(out.getvalue())


class FakeSessionSandbox(FakeSandbox):
    """A FakeSandbox that also offers ``session(memory_mb=)`` (FakeSession objects, recorded)."""

    def __init__(self) -> None:
        super().__init__()
        self.sessions: list[FakeSession] = []

    def session(self, *, memory_mb: int | None = None) -> FakeSession:
        self.sessions.append(FakeSession(self, memory_mb))
        return self.sessions[-1]
