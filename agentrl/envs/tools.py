"""Tools for :class:`~agentrl.envs.tool_env.ToolEnv`: plain typed Python functions, and Python code
run in the sandbox.

A **function tool** is any typed function; its JSON schema comes from the signature and the
docstring (Google ``Args:`` or reST ``:param x:`` sections)::

    def add(a: int, b: int = 0) -> int:
        \"\"\"Add two integers.

        Args:
            a: the first addend.
            b: the second addend.
        \"\"\"
        return a + b

    function_tool(add).schema() == {"type": "function", "function": {
        "name": "add", "description": "Add two integers.",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "integer", "description": "the first addend."},
            "b": {"type": "integer", "description": "the second addend.", "default": 0}},
          "required": ["a"], "additionalProperties": False}}}

Supported annotations: ``str``, ``int``, ``float``, ``bool``, ``None``, ``list[T]``,
``tuple[T, ...]``, ``dict[str, T]``, ``Literal[...]``, ``Enum`` subclasses, ``T | None`` /
``Optional[T]``, unions, ``Annotated[T, "description"]`` and ``Any``. Arguments are checked
against the signature before the call (unknown or missing arguments and wrong JSON types are a
:class:`~agentrl.errors.ToolCallError`; an integer is accepted for a ``float``). The function may
be sync (run in a worker thread) or ``async``; its return value is shown with ``str()`` (``None``
as an empty output); an exception it raises is shown to the model as ``"{Type}: {message}"`` —
except an :class:`~agentrl.errors.InfraError`, which marks the episode as an infrastructure failure.

A **sandbox tool** (:class:`PythonTool`) runs model-written code with
:meth:`agentrl.sandbox.Sandbox.run`. With ``session=True`` the interpreter state persists across the
calls of one episode (notebook-like); see :class:`PythonSession`.
"""

from __future__ import annotations

import ast
import enum
import inspect
import re
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, Union, runtime_checkable

import anyio

from agentrl.envs.parsers import ToolOutput
from agentrl.errors import ConfigError, InfraError, SandboxError, ToolCallError

if TYPE_CHECKING:
    from agentrl.sandbox.base import ExecResult, Sandbox

__all__ = [
    "Tool",
    "ToolContext",
    "FunctionTool",
    "PythonTool",
    "PythonSession",
    "function_tool",
    "as_tool",
    "json_schema",
    "with_display",
    "replay_script",
    "describe_exec",
    "truncate_middle",
]


@runtime_checkable
class ToolContext(Protocol):
    """What a tool may use from the environment that calls it (a :class:`ToolEnv` is one)."""

    row: dict[str, Any] | None
    """The current episode's dataset row."""

    async def get_sandbox(self) -> Sandbox:
        """The sandbox code runs in (created at the first call when the env owns it).

        Raises:
            SandboxError: it cannot be created.
        """
        ...

    def python_session(self, tool: PythonTool) -> PythonSession:
        """The episode's :class:`PythonSession` for ``tool`` (one per tool, reset with the episode)."""
        ...


@runtime_checkable
class Tool(Protocol):
    """A tool the model can call.

    Attributes:
        name: the name the model calls it by.
        description: what it does (shown to the model).
        parameters: the JSON schema (``"type": "object"``) of its arguments.
    """

    name: str
    description: str
    parameters: dict[str, Any]

    def schema(self) -> dict[str, Any]:
        """The OpenAI-style function schema ``{"type": "function", "function": {name, description, parameters}}``."""
        ...

    async def call(self, arguments: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        """Run the tool; return what the model sees.

        Raises:
            ToolCallError: the arguments do not fit the tool (the model's mistake).
            InfraError: the infrastructure failed (the episode is discarded).
        """
        ...


def _schema(name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


# --------------------------------------------------------------------------------------------
# Function tools
# --------------------------------------------------------------------------------------------

_SECTION = re.compile(
    r"^\s*(Args|Arguments|Parameters|Params|Returns?|Yields?|Raises|Examples?|Notes?|Attributes)\s*:\s*$",
    re.IGNORECASE,
)
_REST_PARAM = re.compile(r"^\s*:param\s+(?:[^:]*\s)?(\w+)\s*:\s*(.*)$")
_GOOGLE_ARG = re.compile(r"^(\s*)\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """``(description, {parameter: description})`` from a Google-style (``Args:``) or reST-style
    (``:param x:``) docstring. The description is the text before the first section, with
    paragraphs kept and lines of a paragraph joined."""
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    head: list[str] = []
    params: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    indent: int | None = None
    for line in lines:
        rest = _REST_PARAM.match(line)
        if rest:
            current, section = rest.group(1), "rest"
            params[current] = rest.group(2).strip()
            continue
        if line.strip().startswith(":"):  # :returns:, :raises: ...
            section, current = "rest-other", None
            continue
        m = _SECTION.match(line)
        if m:
            section = m.group(1).lower()
            current, indent = None, None
            continue
        if section is None:
            head.append(line)
        elif section in ("args", "arguments", "parameters", "params"):
            arg = _GOOGLE_ARG.match(line)
            if arg and (indent is None or len(arg.group(1)) <= indent):
                indent = len(arg.group(1))
                current = arg.group(2)
                params[current] = arg.group(3).strip()
            elif current and line.strip():
                params[current] = (params[current] + " " + line.strip()).strip()
        elif section == "rest" and current and line.strip():
            params[current] = (params[current] + " " + line.strip()).strip()
    paragraphs = [" ".join(p.split()) for p in "\n".join(head).strip().split("\n\n")]
    return "\n\n".join(p for p in paragraphs if p), params


def json_schema(annotation: Any) -> dict[str, Any]:
    """The JSON schema of values of the Python type ``annotation`` (see the module docstring for
    what is supported).

    Raises:
        ConfigError: the annotation has no JSON form (e.g. a class, ``bytes``, a callable).
    """
    if annotation is inspect.Parameter.empty or annotation is Any:
        return {}
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        schema = json_schema(args[0])
        notes = [a for a in args[1:] if isinstance(a, str)]
        if notes:
            schema["description"] = " ".join(notes)
        return schema
    if annotation is None or annotation is type(None):
        return {"type": "null"}
    if annotation is bool:
        return {"type": "boolean"}
    if annotation is int:
        return {"type": "integer"}
    if annotation is float:
        return {"type": "number"}
    if annotation is str:
        return {"type": "string"}
    if annotation in (list, tuple, set, frozenset):
        return {"type": "array"}
    if annotation is dict:
        return {"type": "object"}
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return {"enum": [m.value for m in annotation]}
    if origin is Literal:
        return {"enum": list(args)}
    if origin in (Union, types.UnionType):
        members = [a for a in args if a is not type(None)]
        if len(members) == 1 and len(args) == 2:
            return {"anyOf": [json_schema(members[0]), {"type": "null"}]}
        return {"anyOf": [json_schema(a) for a in args]}
    if origin in (list, set, frozenset, Sequence) or origin is getattr(typing, "Sequence", None):
        return {"type": "array", "items": json_schema(args[0])} if args else {"type": "array"}
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return {"type": "array", "items": json_schema(args[0])}
        return {"type": "array", "prefixItems": [json_schema(a) for a in args], "minItems": len(args), "maxItems": len(args)}
    if origin is dict:
        if args and args[0] is not str:
            raise ConfigError(f"tool argument type {annotation!r}: JSON object keys are strings (use dict[str, ...])")
        return {"type": "object", "additionalProperties": json_schema(args[1])} if args else {"type": "object"}
    raise ConfigError(f"tool argument type {annotation!r} has no JSON schema (use str, int, float, bool, list, dict, Literal, Enum)")


def _check_value(value: Any, schema: dict[str, Any], where: str) -> Any:
    """``value`` checked against (our subset of) JSON schema; ints become floats for ``number``.

    Raises:
        ToolCallError: the value does not fit (the message says where and what was expected).
    """
    if not schema:
        return value
    if "anyOf" in schema:
        for option in schema["anyOf"]:
            try:
                return _check_value(value, option, where)
            except ToolCallError:
                continue
        raise ToolCallError(f"{where}: {json_type(value)} {value!r:.60} fits none of the allowed types")
    if "enum" in schema:
        if value not in schema["enum"]:
            raise ToolCallError(f"{where}: {value!r:.60} is not one of {schema['enum']}")
        return value
    kind = schema.get("type")
    if kind == "null" and value is None:
        return None
    if kind == "boolean" and isinstance(value, bool):
        return value
    if kind == "integer" and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind == "number" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if kind == "string" and isinstance(value, str):
        return value
    if kind == "array" and isinstance(value, list):
        if "prefixItems" in schema:
            if len(value) != len(schema["prefixItems"]):
                raise ToolCallError(f"{where}: expected {len(schema['prefixItems'])} items, got {len(value)}")
            return [_check_value(v, s, f"{where}[{i}]") for i, (v, s) in enumerate(zip(value, schema["prefixItems"]))]
        items = schema.get("items", {})
        return [_check_value(v, items, f"{where}[{i}]") for i, v in enumerate(value)]
    if kind == "object" and isinstance(value, dict):
        extra = schema.get("additionalProperties", {})
        if isinstance(extra, dict):
            return {k: _check_value(v, extra, f"{where}[{k!r}]") for k, v in value.items()}
        return value
    raise ToolCallError(f"{where}: expected {kind}, got {json_type(value)} {value!r:.60}")


def json_type(value: Any) -> str:
    """The JSON type name of a decoded JSON value (``"integer"``, ``"string"``, ``"object"``, ...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, dict) else type(value).__name__


def _convert(value: Any, annotation: Any) -> Any:
    """Turn checked JSON values into the annotated Python type where they differ (Enum, tuple, set)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _convert(value, typing.get_args(annotation)[0])
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return annotation(value)
    if origin is tuple or annotation is tuple:
        return tuple(value)
    if origin in (set, frozenset) or annotation in (set, frozenset):
        return (origin or annotation)(value)
    return value


class FunctionTool:
    """A tool made from a plain typed Python function (see :func:`function_tool`).

    Attributes:
        name, description, parameters: as in :class:`Tool`.
        fn: the function.
        timeout_s: longest the call may run, seconds (None: the environment's ``tool_timeout_s``).
            A sync function that overruns keeps running in its worker thread; the model is told
            it timed out.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        timeout_s: float | None = None,
    ) -> None:
        if not callable(fn):
            raise ConfigError(f"a tool must be callable, got {fn!r}")
        self.fn = fn
        self.name = name or getattr(fn, "__name__", "")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}", self.name):
            raise ConfigError(f"tool name {self.name!r} must be 1-64 letters, digits, '_', '.', '-'")
        doc_description, doc_params = parse_docstring(inspect.getdoc(fn))
        self.description = description if description is not None else doc_description
        self.timeout_s = timeout_s
        try:
            signature = inspect.signature(fn)
            hints = typing.get_type_hints(fn, include_extras=True)
        except (TypeError, ValueError, NameError) as exc:
            raise ConfigError(f"tool {self.name!r}: cannot read its signature: {exc}") from exc
        self._annotations: dict[str, Any] = {}
        properties: dict[str, Any] = {}
        required: list[str] = []
        for pname, param in signature.parameters.items():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise ConfigError(f"tool {self.name!r}: *args/**kwargs have no schema; name every argument")
            if param.kind is param.POSITIONAL_ONLY:
                raise ConfigError(f"tool {self.name!r}: positional-only argument {pname!r} cannot be passed by name")
            annotation = hints.get(pname, inspect.Parameter.empty)
            try:
                prop = json_schema(annotation)
            except ConfigError as exc:
                raise ConfigError(f"tool {self.name!r}, argument {pname!r}: {exc}") from exc
            if pname in doc_params and "description" not in prop:
                prop["description"] = doc_params[pname]
            if param.default is param.empty:
                required.append(pname)
            elif _is_json(param.default):
                default = param.default.value if isinstance(param.default, enum.Enum) else param.default
                prop["default"] = list(default) if isinstance(default, tuple) else default
            self._annotations[pname] = annotation
            properties[pname] = prop
        self.parameters: dict[str, Any] = {
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": False,
        }

    def __repr__(self) -> str:
        return f"FunctionTool({self.name!r})"

    def schema(self) -> dict[str, Any]:
        return _schema(self.name, self.description, self.parameters)

    def bind(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """The keyword arguments for the function, checked against the schema.

        Raises:
            ToolCallError: an unknown or missing argument, or a value of the wrong type.
        """
        props = self.parameters["properties"]
        unknown = sorted(set(arguments) - set(props))
        if unknown:
            raise ToolCallError(f"{self.name}() got unknown argument(s) {unknown}; it takes {sorted(props) or 'none'}")
        missing = [p for p in self.parameters["required"] if p not in arguments]
        if missing:
            raise ToolCallError(f"{self.name}() is missing required argument(s) {missing}")
        return {
            k: _convert(_check_value(v, props[k], f"{self.name}() argument {k!r}"), self._annotations[k])
            for k, v in arguments.items()
        }

    async def call(self, arguments: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        kwargs = self.bind(arguments)
        timeout_s = self.timeout_s if self.timeout_s is not None else getattr(ctx, "tool_timeout_s", None)
        try:
            with anyio.fail_after(timeout_s):
                if inspect.iscoroutinefunction(self.fn):
                    value = await self.fn(**kwargs)
                else:
                    value = await anyio.to_thread.run_sync(lambda: self.fn(**kwargs), abandon_on_cancel=True)
                    if inspect.isawaitable(value):
                        value = await value
        except InfraError:
            raise
        except TimeoutError:
            return ToolOutput(f"TimeoutError: {self.name}() ran longer than {timeout_s:g} s", True, self.name)
        except Exception as exc:
            return ToolOutput(f"{type(exc).__name__}: {exc}", True, self.name)
        return ToolOutput("" if value is None else str(value), False, self.name)


def _is_json(value: Any) -> bool:
    if isinstance(value, enum.Enum):
        value = value.value
    return value is None or isinstance(value, (bool, int, float, str)) or (
        isinstance(value, (list, tuple)) and all(_is_json(v) for v in value)
    )


def function_tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout_s: float | None = None,
) -> Any:
    """Make a :class:`FunctionTool` from ``fn``; usable as ``@function_tool`` or
    ``@function_tool(name=..., timeout_s=...)``. A plain function in ``ToolEnv.tools`` is
    wrapped the same way, so the decorator is only needed to override these settings.

    Raises:
        ConfigError: the function's signature has no JSON schema (see the module docstring).
    """
    if fn is None:
        return lambda f: FunctionTool(f, name=name, description=description, timeout_s=timeout_s)
    return FunctionTool(fn, name=name, description=description, timeout_s=timeout_s)


def as_tool(obj: Tool | Callable[..., Any]) -> Tool:
    """``obj`` if it is already a :class:`Tool`, else ``FunctionTool(obj)``."""
    if isinstance(obj, Tool):
        return obj
    return FunctionTool(obj)


# --------------------------------------------------------------------------------------------
# Python code in the sandbox
# --------------------------------------------------------------------------------------------


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
        tree = ast.parse(code)
    except SyntaxError:
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
    silent sandbox is an infrastructure failure come from the environment (``ctx``).
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
        return _schema(self.name, self.description, self.parameters)

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
        timeout_s = getattr(ctx, "timeout_s", None)
        memory_mb = getattr(ctx, "memory_mb", None)
        deadline = 2 * (timeout_s or 30.0) + float(getattr(ctx, "deadline_grace_s", 30.0))
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

