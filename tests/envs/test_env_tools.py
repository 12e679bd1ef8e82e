"""Tools: schemas from type hints and docstrings, argument checks, calls, Python sessions."""

import enum
from typing import Annotated, Any, Literal, Optional

import anyio
import pytest

from agentrl.envs.tools import (
    FunctionTool,
    PythonTool,
    ToolLimits,
    as_tool,
    function_tool,
    json_schema,
    parse_docstring,
    replay_script,
    truncate_middle,
    with_display,
)
from agentrl.errors import ConfigError, SandboxError, ToolCallError
from agentrl.sandbox.testing import FakeResult, FakeSandbox, FakeSessionSandbox, SubprocessSandbox

BACKENDS = ["asyncio", "trio"]


def add(a: int, b: int = 0) -> int:
    """Add two integers.

    Returns their sum.

    Args:
        a: the first addend.
        b: the second addend,
            zero by default.

    Returns:
        a + b
    """
    return a + b


def test_schema_from_hints_and_google_docstring() -> None:
    assert function_tool(add).schema() == {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.\n\nReturns their sum.",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "integer", "description": "the first addend."},
                    "b": {"type": "integer", "description": "the second addend, zero by default.", "default": 0},
                },
                "required": ["a"],
                "additionalProperties": False,
            },
        },
    }


class Unit(enum.Enum):
    CM = "cm"
    INCH = "in"


def convert(
    value: float,
    unit: Unit,
    mode: Literal["round", "exact"] = "exact",
    digits: Optional[int] = None,
    tags: list[str] | None = None,
    weights: dict[str, float] | None = None,
    pair: tuple[int, int] = (0, 0),
    note: Annotated[str, "free text"] = "",
    flag: bool = False,
    anything: Any = None,
) -> str:
    """Convert a length.

    :param value: the length.
    :param unit: its unit.
    :returns: the converted length.
    """
    return f"{value} {unit.value} {mode} {digits} {tags} {weights} {pair} {note} {flag} {anything}"


def test_schema_of_many_types_and_rest_docstring() -> None:
    tool = FunctionTool(convert)
    props = tool.parameters["properties"]
    assert tool.description == "Convert a length."
    assert props["value"] == {"type": "number", "description": "the length."}
    assert props["unit"] == {"enum": ["cm", "in"], "description": "its unit."}
    assert props["mode"] == {"enum": ["round", "exact"], "default": "exact"}
    assert props["digits"] == {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None}
    assert props["tags"]["anyOf"][0] == {"type": "array", "items": {"type": "string"}}
    assert props["weights"]["anyOf"][0] == {"type": "object", "additionalProperties": {"type": "number"}}
    assert props["pair"]["prefixItems"] == [{"type": "integer"}, {"type": "integer"}] and props["pair"]["default"] == [0, 0]
    assert props["note"] == {"type": "string", "description": "free text", "default": ""}
    assert props["flag"] == {"type": "boolean", "default": False}
    assert props["anything"] == {"default": None}
    assert tool.parameters["required"] == ["value", "unit"]


def test_bind_checks_and_converts_arguments() -> None:
    tool = FunctionTool(convert)
    kwargs = tool.bind({"value": 3, "unit": "in", "pair": [1, 2], "digits": None, "weights": {"a": 1}})
    assert kwargs == {"value": 3.0, "unit": Unit.INCH, "pair": (1, 2), "digits": None, "weights": {"a": 1.0}}
    assert isinstance(kwargs["value"], float)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ({"unit": "cm"}, "missing required argument(s) ['value']"),
        ({"value": 1, "unit": "cm", "colour": "red"}, "unknown argument(s) ['colour']"),
        ({"value": "1", "unit": "cm"}, "argument 'value': expected number, got string"),
        ({"value": True, "unit": "cm"}, "expected number, got boolean"),
        ({"value": 1, "unit": "mm"}, "'mm' is not one of ['cm', 'in']"),
        ({"value": 1, "unit": "cm", "digits": 1.5}, "fits none of the allowed types"),
        ({"value": 1, "unit": "cm", "tags": ["a", 2]}, "argument 'tags'"),
        ({"value": 1, "unit": "cm", "pair": [1]}, "expected 2 items, got 1"),
        ({"value": 1, "unit": "cm", "flag": 1}, "expected boolean, got integer"),
    ],
)
def test_bind_rejects_bad_arguments(args: dict, needle: str) -> None:
    with pytest.raises(ToolCallError) as info:
        FunctionTool(convert).bind(args)
    assert needle in str(info.value)


def test_unsupported_signatures_are_config_errors() -> None:
    def takes_bytes(data: bytes) -> None: ...

    def varargs(*xs: int) -> None: ...

    def int_keys(d: dict[int, str]) -> None: ...

    for fn, needle in [(takes_bytes, "no JSON schema"), (varargs, "*args"), (int_keys, "keys are strings")]:
        with pytest.raises(ConfigError, match=needle.replace("*", r"\*")):
            FunctionTool(fn)
    with pytest.raises(ConfigError, match="tool name"):
        FunctionTool(add, name="bad name!")
    with pytest.raises(ConfigError, match="must be callable"):
        FunctionTool(3)  # type: ignore[arg-type]
    assert json_schema(Any) == {}


def test_decorator_forms_and_as_tool() -> None:
    @function_tool(name="plus", description="Plus.", timeout_s=1.0)
    def f(x: int) -> int:
        return x

    assert (f.name, f.description, f.timeout_s) == ("plus", "Plus.", 1.0)
    assert as_tool(f) is f and isinstance(as_tool(add), FunctionTool)
    assert parse_docstring(None) == ("", {})


class Ctx:
    """A minimal ToolContext."""

    row = None
    tool_timeout_s: float | None = 5.0
    timeout_s: float | None = 2.0
    memory_mb: int | None = 64
    deadline_grace_s = 1.0

    def __init__(self, sandbox: Any = None) -> None:
        self.sandbox = sandbox or FakeSandbox()
        self.sessions: dict = {}

    @property
    def limits(self) -> ToolLimits:
        return ToolLimits(self.timeout_s, self.memory_mb, self.tool_timeout_s, self.deadline_grace_s)

    async def get_sandbox(self) -> Any:
        return self.sandbox

    def python_session(self, tool: PythonTool) -> Any:
        from agentrl.envs.tools import PythonSession

        return self.sessions.setdefault(tool.name, PythonSession(tool))


@pytest.mark.parametrize("backend", BACKENDS)
def test_function_tool_calls(backend: str) -> None:
    async def slow_async(x: int) -> str:
        await anyio.sleep(10)
        return "late"

    def raises(x: int) -> None:
        raise ValueError(f"no {x}")

    def returns_none() -> None:
        return None

    async def async_double(x: int) -> int:
        return 2 * x

    async def main() -> None:
        ctx = Ctx()
        assert (await FunctionTool(add).call({"a": 2, "b": 3}, ctx)).text == "5"
        out = await FunctionTool(async_double).call({"x": 4}, ctx)
        assert (out.text, out.error, out.name) == ("8", False, "async_double")
        out = await FunctionTool(raises).call({"x": 1}, ctx)
        assert (out.text, out.error) == ("ValueError: no 1", True)
        assert (await FunctionTool(returns_none).call({}, ctx)).text == ""
        with anyio.fail_after(2):
            out = await FunctionTool(slow_async, timeout_s=0.05).call({"x": 1}, ctx)
        assert out.error and out.text == "TimeoutError: slow_async() ran longer than 0.05 s"
        with pytest.raises(ToolCallError):
            await FunctionTool(add).call({"a": "x"}, ctx)

    anyio.run(main, backend=backend)


def test_function_tool_infra_error_propagates() -> None:
    def broken() -> None:
        raise SandboxError("backend down")

    async def main() -> None:
        with pytest.raises(SandboxError):
            await FunctionTool(broken).call({}, Ctx())

    anyio.run(main)


@pytest.mark.parametrize(
    ("code", "shown"),
    [
        ("1 + 1", "2"),
        ("x = 2\nx * 3", "6"),
        ("x = 1; x + 1  # comment", "2"),
        ("f = lambda a, b: a + b\nf(\n  1,\n  2)\n", "3"),
        ("'a' + 'b'", "'ab'"),
        ("None", ""),
        ("print(5)", "5"),
        ("for i in range(2):\n    i", ""),
        ("x = 7", ""),
    ],
)
def test_with_display_prints_the_last_expression(code: str, shown: str) -> None:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(with_display(code), {})
    assert out.getvalue().strip() == shown
    displayed = with_display(code)
    assert displayed == code or len(displayed.splitlines()) == len(code.rstrip("\n").splitlines()) + 1  # lines keep their numbers


def test_with_display_leaves_bad_code_alone() -> None:
    assert with_display("def f(:") == "def f(:"
    assert with_display("") == ""


def test_with_display_leaves_code_too_deep_to_parse_alone() -> None:
    """A model's 5,000-term sum is too deep for ``ast``: it runs as written (the interpreter
    reports it), never an error of the environment."""
    deep = "+".join(["1"] * 5000)
    assert with_display(deep) == deep


def test_truncate_middle() -> None:
    assert truncate_middle("short", 10) == "short"
    cut = truncate_middle("A" * 50 + "B" * 50, 20)
    assert cut.startswith("A" * 10) and cut.endswith("B" * 10) and "[... 80 characters cut ...]" in cut


@pytest.mark.parametrize("backend", BACKENDS)
def test_python_session_by_replay(backend: str) -> None:
    """Without sandbox sessions, state is rebuilt by replaying earlier cells (silently)."""

    async def main() -> None:
        sandbox = SubprocessSandbox()
        ctx = Ctx(sandbox)
        tool = PythonTool()
        out = await tool.call({"code": "x = 40\nprint('first')"}, ctx)
        assert (out.text.strip(), out.error) == ("first", False)
        out = await tool.call({"code": "x + 2"}, ctx)
        assert out.text.strip() == "42" and "first" not in out.text  # replayed output is discarded
        out = await tool.call({"code": "y = x\n1/0"}, ctx)
        assert out.error and "ZeroDivisionError" in out.text and 'File "cell3.py", line 2' in out.text
        assert "cell1.py" not in out.text and "_agentrl" not in out.text
        out = await tool.call({"code": "y"}, ctx)  # the failing cell's effects before the error persist
        assert out.text.strip() == "40"
        assert len(ctx.python_session(tool).cells) == 4
        assert sandbox.timeouts[0] == 2.0 and sandbox.timeouts[-1] > 2.0  # replay time is added

    anyio.run(main, backend=backend)


def test_replayed_timeouts_are_not_replayed() -> None:
    async def main() -> None:
        sandbox = SubprocessSandbox()
        ctx = Ctx(sandbox)
        ctx.timeout_s = 0.5
        tool = PythonTool()
        await tool.call({"code": "x = 1"}, ctx)
        out = await tool.call({"code": "while True: pass"}, ctx)
        assert out.error and "TimeoutError: the code ran longer than 0.5 s" in out.text
        assert [c.code for c in ctx.python_session(tool).cells] == ["x = 1"]
        assert (await tool.call({"code": "x"}, ctx)).text.strip() == "1"

    anyio.run(main)


@pytest.mark.parametrize("backend", BACKENDS)
def test_python_session_live_and_restored(backend: str) -> None:
    async def main() -> None:
        sandbox = FakeSessionSandbox()
        ctx = Ctx(sandbox)
        tool = PythonTool()
        session = ctx.python_session(tool)
        assert (await tool.call({"code": "x = 5"}, ctx)).text == ""
        assert (await tool.call({"code": "x * 2"}, ctx)).text.strip() == "10"
        assert len(sandbox.sessions) == 1 and sandbox.sessions[0].memory_mb == 64 and sandbox.calls == []
        out = await tool.call({"code": "LOSE_STATE = 1"}, ctx)  # the interpreter dies
        assert out.error
        assert (await tool.call({"code": "x + 1"}, ctx)).text.strip() == "6"  # restored by replay
        assert session.restores == 1
        await session.aclose()
        assert sandbox.sessions[0].exited and not session.is_live
        assert (await tool.call({"code": "x + 2"}, ctx)).text.strip() == "7"  # reopened and restored
        assert len(sandbox.sessions) == 2 and session.restores == 2
        await session.aclose()

    anyio.run(main, backend=backend)


def test_python_tool_without_session_sends_code_as_is() -> None:
    async def main() -> None:
        ctx = Ctx()
        tool = PythonTool(session=False, display=False, prepare=lambda c: c + "\nprint('prepared')")
        out = await tool.call({"code": "print(1)"}, ctx)
        assert out.text == "1\nprepared\n"
        assert ctx.sandbox.calls == [("print(1)\nprint('prepared')", 2.0, 64)]
        with pytest.raises(ToolCallError, match="empty"):
            await tool.call({"code": "  "}, ctx)
        with pytest.raises(ToolCallError, match="one string argument 'code'"):
            await tool.call({"source": "x"}, ctx)

    anyio.run(main)


def test_python_tool_reports_limits() -> None:
    async def main() -> None:
        ctx = Ctx(FakeSandbox(reply=lambda code: FakeResult("partial\n", memory_exceeded=True, exit_code=1)))
        out = await PythonTool(session=False).call({"code": "x = [0] * 10**10"}, ctx)
        assert out.error and out.text == "partial\nMemoryError: the code used more than 64 MB and was stopped"

    anyio.run(main)


def test_python_tool_silent_sandbox_is_an_infra_error() -> None:
    async def main() -> None:
        ctx = Ctx(FakeSandbox(hang=True))
        ctx.timeout_s, ctx.deadline_grace_s = 0.01, 0.05
        with pytest.raises(SandboxError, match="no result within"):
            await PythonTool().call({"code": "1"}, ctx)

    anyio.run(main, backend="trio")


def test_replay_script_runs_cells_in_order() -> None:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(replay_script(["print('hidden')\na = 1", "raise KeyError('ignored')", "print(a + 1)"]), {})
    assert out.getvalue() == "2\n"
