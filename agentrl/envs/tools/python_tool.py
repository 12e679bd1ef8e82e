"""The sandboxed Python tool: model-written code run with :meth:`agentrl.sandbox.Sandbox.run`,
with its per-episode interpreter state (:class:`PythonSession`, live or by replay) and how a
result is shown to the model."""

from __future__ import annotations

import ast
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio

from agentrl.envs import pyast
from agentrl.envs.parsers import ToolOutput
from agentrl.envs.tools.protocols import ToolContext, tool_schema
from agentrl.errors import InfraError, SandboxError, ToolCallError

if TYPE_CHECKING:
    from agentrl.sandbox.base import ExecResult, Sandbox

__all__ = ["PythonSession", "PythonTool", "describe_exec", "replay_script", "truncate_middle", "with_display"]


def truncate_middle(text: str, limit: int) -> str:
    """``text`` if it has at most ``limit`` characters, else its head and tail around a marker
    ``"\\n[... N characters cut ...]\\n"`` (the result has about ``limit`` characters)."""
    if limit <= 0 or len(text) <= limit:
        return text
    head = limit // 2
    tail = limit - head
    return f"{text[:head]}\n[... {len(text) - head - tail} characters cut ...]\n{text[-tail:]}"


def with_display(code: str) -> str:
    """``code`` with its last statement, if it is an expression other than a ``print(...)`` call,
    assigned to ``_`` and a final line added that prints ``repr(_)`` unless it is None (as a
    notebook cell shows its value): ``x = 2\nx + 3`` becomes ``x = 2\n_ = x + 3`` plus the print line.

    Earlier lines are unchanged and keep their numbers, so tracebacks point at what the model
    wrote. Code that does not parse is returned unchanged (running it reports the syntax error).
    """
    try:
        tree = pyast.parse(code)
    except (SyntaxError, RecursionError, MemoryError):  # too deep to parse: the interpreter says so
        return code
    if not tree.body or not isinstance(tree.body[-1], ast.Expr):
        return code
    node = tree.body[-1]
    value = node.value
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "print":
        return code
    lines = code.splitlines(keepends=True)
    first = lines[node.lineno - 1]
    prefix = "".join(lines[: node.lineno - 1]) + first[: _byte_col(first, node.col_offset)]
    rest = code[len(prefix) :]
    return f"{prefix}_ = {rest.rstrip()}\nif _ is not None: print(repr(_))\n"


def _byte_col(line: str, col: int) -> int:
    """ast column offsets count UTF-8 bytes; the character index for ``col`` in ``line``."""
    return len(line.encode("utf-8")[:col].decode("utf-8", "ignore"))


def describe_exec(result: ExecResult, *, timeout_s: float | None, memory_mb: int | None) -> tuple[str, bool]:
    """``(text, failed)`` for one execution as the model sees it: stdout, and on failure the
    stderr (a traceback) or a one-line reason (``TimeoutError: ...``, ``MemoryError: ...``,
    ``the code exited with status N``)."""
    out = result.stdout + ("\n[stdout truncated]" if result.stdout_truncated else "")
    if result.timed_out:
        limit = f"{timeout_s:g} s" if timeout_s is not None else "its time limit"
        reason = f"TimeoutError: the code ran longer than {limit} and was stopped"
    elif result.memory_exceeded:
        limit = f"{memory_mb} MB" if memory_mb is not None else "its memory limit"
        reason = f"MemoryError: the code used more than {limit} and was stopped"
    elif result.exit_code != 0:
        reason = result.stderr.rstrip() or f"the code exited with status {result.exit_code}"
    else:
        return out, False
    return (out.rstrip() + "\n" + reason if out.strip() else reason), True


# The script that replays earlier cells (output discarded, errors ignored), then runs the last
# one, each compiled as "cell<N>.py" (as sandbox sessions name their cells) with its source
# registered for tracebacks.
_REPLAY = '''\
import contextlib as _c, io as _io, linecache as _l, sys as _s, traceback as _t
def _agentrl_cells():
    cells = {cells!r}
    names = ["cell%d.py" % (i + 1) for i in range(len(cells))]
    g = globals()
    for i, src in enumerate(cells):
        _l.cache[names[i]] = (len(src), None, src.splitlines(True), names[i])
        last = i == len(cells) - 1
        try:
            code = compile(src, names[i], "exec", dont_inherit=True)
            if last:
                exec(code, g)
            else:
                with _c.redirect_stdout(_io.StringIO()), _c.redirect_stderr(_io.StringIO()):
                    exec(code, g)
        except SystemExit:
            if last:
                raise
        except BaseException as e:
            if last:
                _s.stdout.flush()
                tb = e.__traceback__
                while tb is not None and tb.tb_frame.f_code.co_filename not in names:
                    tb = tb.tb_next
                _t.print_exception(type(e), e, tb)
                _s.exit(1)
_agentrl_cells()
del _agentrl_cells
'''


def replay_script(cells: Sequence[str]) -> str:
    """A script that runs ``cells[:-1]`` silently (output discarded, exceptions ignored), then
    ``cells[-1]`` normally (its traceback, if any, shows only its own frames, as ``cell<N>.py``)."""
    return _REPLAY.format(cells=list(cells))


@dataclass
class _Cell:
    code: str
    wall_s: float


class PythonSession:
    """The interpreter state of one episode for one :class:`PythonTool`.

    Two ways to keep state, chosen by what the sandbox offers:

    - **live**: the sandbox has sessions (``sandbox.session(memory_mb=...)``, an async context
      manager with ``run``; see :class:`agentrl.sandbox.base.SandboxSession`): the cells run in one
      interpreter, opened at the first call and closed by :meth:`aclose`;
    - **replay** (sandboxes without sessions, e.g. test doubles): each call runs a fresh
      interpreter that first re-runs the episode's earlier cells with their output discarded and
      their errors ignored, then the new cell (:func:`replay_script`). Replayed cells run again:
      their earlier running time is added to the call's time limit, and code that is not
      deterministic (random numbers, clocks) may see different values than the first time.

    The cells are remembered either way (except cells that timed out, ran out of memory or lost
    the session's state, which are never replayed). When a live session is lost (a cell ran past
    its deadline or killed the interpreter: ``ExecResult.state_lost``) or was closed (``aclose`` at
    the end of a sync ``step``), the next call first replays the remembered cells silently in the
    (new) interpreter, so the model's variables are back.
    """

    def __init__(self, tool: PythonTool) -> None:
        self.tool = tool
        self.cells: list[_Cell] = []
        """The cells that ran (and will be replayed when state must be rebuilt)."""
        self.restores = 0
        """How many times state was rebuilt by replay in a live session."""
        self._live: Any = None
        self._live_cells = 0  # how many of self.cells the live interpreter holds

    async def run(self, sandbox: Sandbox, code: str, *, timeout_s: float | None, memory_mb: int | None) -> ExecResult:
        """Run one cell, keeping state; returns the sandbox's result for this cell.

        Raises:
            SandboxError: the sandbox (or its session) failed.
        """
        if callable(getattr(sandbox, "session", None)):
            result = await self._run_live(sandbox, code, timeout_s=timeout_s, memory_mb=memory_mb)
        else:
            budget = timeout_s
            if self.cells:
                base = timeout_s if timeout_s is not None else float(getattr(sandbox, "timeout_s", 10.0))
                budget = base + sum(c.wall_s for c in self.cells)
            script = replay_script([c.code for c in self.cells] + [code])
            result = await sandbox.run(script, timeout_s=budget, memory_mb=memory_mb)
        lost = bool(getattr(result, "state_lost", False))
        if not (result.timed_out or result.memory_exceeded or lost):
            self.cells.append(_Cell(code, float(getattr(result, "wall_s", 0.0))))
            if self._live is not None:
                self._live_cells = len(self.cells)
        if lost:
            self._live_cells = 0
        return result

    async def _run_live(self, sandbox: Any, code: str, *, timeout_s: float | None, memory_mb: int | None) -> ExecResult:
        if self._live is None:
            self._live = await _open_session(sandbox, memory_mb)
            self._live_cells = 0
        if self._live_cells < len(self.cells):  # lost or re-opened: rebuild the episode's state
            base = timeout_s if timeout_s is not None else float(getattr(sandbox, "timeout_s", 10.0))
            restore = replay_script([c.code for c in self.cells] + ["pass"])
            await self._live.run(restore, timeout_s=base + sum(c.wall_s for c in self.cells), memory_mb=memory_mb)
            self.restores += 1
            self._live_cells = len(self.cells)
        return await self._live.run(code, timeout_s=timeout_s, memory_mb=memory_mb)  # type: ignore[no-any-return]

    async def aclose(self) -> None:
        """Close the live sandbox session, if any (the cells are kept: a later call restores them)."""
        live, self._live = self._live, None
        self._live_cells = 0
        if live is not None:
            if hasattr(live, "__aexit__"):
                await live.__aexit__(None, None, None)
            else:
                await live.aclose()

    @property
    def is_live(self) -> bool:
        """True while a live sandbox session is open."""
        return self._live is not None


async def _open_session(sandbox: Any, memory_mb: int | None) -> Any:
    """``sandbox.session(memory_mb=...)``, started (entered as an async context manager)."""
    try:
        session = sandbox.session(memory_mb=memory_mb) if memory_mb is not None else sandbox.session()
        if inspect.isawaitable(session):
            session = await session
        if hasattr(session, "__aenter__"):
            entered = await session.__aenter__()
            session = entered if entered is not None else session
    except InfraError:
        raise
    except Exception as exc:
        raise SandboxError(f"cannot open a sandbox session: {type(exc).__name__}: {exc}") from exc
    if not callable(getattr(session, "run", None)):
        raise SandboxError(f"the sandbox session {session!r} has no run() method")
    return session


class PythonTool:
    """A sandbox-backed tool that runs Python code (argument ``code``).

    Args:
        name: the tool's name (``"python"``; ReTool's ``<code>`` blocks call this name).
        description: shown to the model.
        session: True: state persists across the episode's calls (:class:`PythonSession`); False:
            every call is a fresh interpreter and the code is sent to the sandbox as is.
        display: True: a last expression statement is printed, as in a notebook (:func:`with_display`).
        prepare: a function applied to the code before it runs (after ``display``), or None.
        describe: ``(result, timeout_s=, memory_mb=) -> (text, failed)``, how a result is shown;
            default :func:`describe_exec`.

    The limits of one execution (``timeout_s``, ``memory_mb``) and the deadline after which a
    silent sandbox is an infrastructure failure come from the environment (``ctx.limits``, a
    :class:`~agentrl.envs.tools.ToolLimits`).
    """

    def __init__(
        self,
        name: str = "python",
        description: str = "Run Python 3 code and return what it prints (stdout), or the error.",
        *,
        session: bool = True,
        display: bool = True,
        prepare: Callable[[str], str] | None = None,
        describe: Callable[..., tuple[str, bool]] = describe_exec,
    ) -> None:
        self.name = name
        self.description = description
        self.session = session
        self.display = display
        self.prepare = prepare
        self.describe = describe
        self.parameters: dict[str, Any] = {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "the Python code to run"}},
            "required": ["code"],
            "additionalProperties": False,
        }

    def __repr__(self) -> str:
        return f"PythonTool({self.name!r}, session={self.session})"

    def schema(self) -> dict[str, Any]:
        return tool_schema(self.name, self.description, self.parameters)

    async def call(self, arguments: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        if set(arguments) != {"code"} or not isinstance(arguments["code"], str):
            raise ToolCallError(f"{self.name}() takes one string argument 'code', got {sorted(arguments)}")
        code = arguments["code"]
        if not code.strip():
            raise ToolCallError(f"{self.name}(): the code is empty")
        if self.display:
            code = with_display(code)
        if self.prepare is not None:
            code = self.prepare(code)
        limits = ctx.limits
        timeout_s, memory_mb = limits.timeout_s, limits.memory_mb
        deadline = limits.code_deadline_s
        if self.session:  # earlier cells may be replayed first
            deadline += sum(c.wall_s for c in ctx.python_session(self).cells)
        sandbox = await ctx.get_sandbox()
        result = None
        with anyio.move_on_after(deadline):
            if self.session:
                result = await ctx.python_session(self).run(sandbox, code, timeout_s=timeout_s, memory_mb=memory_mb)
            else:
                result = await sandbox.run(code, timeout_s=timeout_s, memory_mb=memory_mb)
        if result is None:
            raise SandboxError(f"the sandbox returned no result within {deadline:g} s")
        text, failed = self.describe(result, timeout_s=timeout_s, memory_mb=memory_mb)
        return ToolOutput(text, failed, self.name)

