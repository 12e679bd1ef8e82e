import pytest

from agentrl.envs.parsers import extract_boxed, parse_code
from agentrl.errors import EnvError, ToolCallError


@pytest.mark.parametrize(
    ("action", "code"),
    [
        ("Let me compute. <code>print(347*58+91)</code>", "print(347*58+91)"),
        ("<code>\nx = 347*58\nprint(x+91)\n</code> then", "x = 347*58\nprint(x+91)"),
        ("<code>\n```python\nprint(1)\n```\n</code>", "print(1)"),
        ("<code>```py\nfor i in range(2):\n    print(i)\n```</code>", "for i in range(2):\n    print(i)"),
        ("<code>print(1)</code> and <code>print(2)</code>", "print(1)"),
        ("</code> stray <code>print(3)</code>", "print(3)"),
    ],
)
def test_parse_code_finds_first_block(action: str, code: str) -> None:
    assert parse_code(action) == code


def test_parse_code_none_without_tag() -> None:
    assert parse_code("The answer is \\boxed{5}.") is None
    assert parse_code("") is None


def test_parse_code_unclosed_is_a_tool_call_error() -> None:
    with pytest.raises(ToolCallError, match=r"<code> tag at character 4 is never closed"):
        parse_code("Ok. <code>print(1)")
    assert issubclass(ToolCallError, EnvError)


def test_parse_code_empty_block_is_a_tool_call_error() -> None:
    with pytest.raises(ToolCallError, match="empty"):
        parse_code("<code>\n  \n</code>")


@pytest.mark.parametrize(
    ("text", "content"),
    [
        ("so \\boxed{20217}.", "20217"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{{a}{b{c}}}", "{a}{b{c}}"),
        ("first \\boxed{1} then \\boxed{2} finally \\boxed{ 3,000 }", " 3,000 "),
        ("\\boxed{}", ""),
        ("no box here", None),
        ("\\boxed{12", None),
        ("\\boxed{1} and \\boxed{2", None),
        ("\\boxed 12", None),
    ],
)
def test_extract_boxed(text: str, content: str | None) -> None:
    assert extract_boxed(text) == content


# ---------------------------------------------------------------- tool-call parsers

import json  # noqa: E402

from agentrl.envs.parsers import HermesParser, ReToolParser, ToolCall, ToolOutput, get_parser  # noqa: E402
from agentrl.errors import ConfigError  # noqa: E402


def test_retool_every_block_is_a_call() -> None:
    calls = ReToolParser().parse("a <code>print(1)</code> b <code>\n```python\nx = 2\n```\n</code> c")
    assert [(c.name, c.arguments, c.error) for c in calls] == [
        ("python", {"code": "print(1)"}, None),
        ("python", {"code": "x = 2"}, None),
    ]
    assert calls[0].start == 2 and calls[0].raw == "<code>print(1)</code>"
    assert ReToolParser().parse("no code here, \\boxed{3}") == []
    assert ReToolParser().parse("stray </code> only") == []


def test_retool_code_may_mention_the_open_tag() -> None:
    (call,) = ReToolParser().parse('<code>s = "<code>"\nprint(s)</code>')
    assert call.error is None and call.arguments["code"] == 's = "<code>"\nprint(s)'


@pytest.mark.parametrize(
    ("action", "needle", "start"),
    [
        ("Let me run <code>print(1)", "tag at character 11 is never closed", 11),  # truncated generation
        ("<code>  \n</code>", "block at character 0 is empty", 0),
    ],
)
def test_retool_malformed_blocks_are_reported(action: str, needle: str, start: int) -> None:
    (call,) = ReToolParser().parse(action)
    assert call.error is not None and needle in call.error and call.start == start
    assert call.arguments == {}


def test_retool_truncated_after_a_good_block() -> None:
    calls = ReToolParser().parse("<code>print(1)</code> then <code>print(")
    assert calls[0].error is None and calls[1].error is not None and "character 27" in calls[1].error


def test_retool_format_outputs_one_message() -> None:
    msgs = ReToolParser().format_outputs([ToolOutput("1\n"), ToolOutput("err", True)])
    assert msgs == [{"role": "tool", "content": "<interpreter>\n1\n</interpreter>\n<interpreter>\nerr\n</interpreter>"}]


def test_retool_describes_only_the_code_tool() -> None:
    schema = {"type": "function", "function": {"name": "python"}}
    assert "<code>" in ReToolParser().describe_tools([schema])
    with pytest.raises(ConfigError, match="use 'hermes' for add"):
        ReToolParser().describe_tools([schema, {"type": "function", "function": {"name": "add"}}])


def call_json(name: str, args: object) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"


def test_hermes_calls_in_order() -> None:
    action = "Thinking.\n" + call_json("add", {"a": 1, "b": 2}) + "\n" + call_json("neg", {"x": 5}) + " done"
    calls = HermesParser().parse(action)
    assert [(c.name, c.arguments, c.error) for c in calls] == [("add", {"a": 1, "b": 2}, None), ("neg", {"x": 5}, None)]
    assert calls[0].start == len("Thinking.\n")
    assert HermesParser().parse("plain answer \\boxed{1}") == []


@pytest.mark.parametrize(
    ("body", "name", "args"),
    [
        ('\n{"name": "f", "arguments": {"a": 1}}\n', "f", {"a": 1}),
        ('{"name": "f"}', "f", {}),  # no arguments
        ('{"name": "f", "arguments": null}', "f", {}),
        ('{"name": "f", "parameters": {"a": 1}}', "f", {"a": 1}),
        ('{"name": "f", "arguments": "{\\"a\\": 1}"}', "f", {"a": 1}),  # arguments as a JSON string
        ('```json\n{"name": "f", "arguments": {"a": [1, 2]}}\n```', "f", {"a": [1, 2]}),
        ('{"name": "f", "arguments": {"text": "<tool_call> inside a string"}}', "f", {"text": "<tool_call> inside a string"}),
    ],
)
def test_hermes_accepted_bodies(body: str, name: str, args: dict) -> None:
    (call,) = HermesParser().parse(f"<tool_call>{body}</tool_call>")
    assert (call.name, call.arguments, call.error) == (name, args, None)


@pytest.mark.parametrize(
    ("action", "needle"),
    [
        ('<tool_call>{"name": "f", "arguments": {"a": 1}', "never closed"),  # truncated
        ("<tool_call>{'name': 'f'}</tool_call>", "not valid JSON"),
        ("<tool_call>[1, 2]</tool_call>", "must hold a JSON object, got list"),
        ('<tool_call>{"arguments": {}}</tool_call>', 'no "name" string'),
        ('<tool_call>{"name": 3}</tool_call>', 'no "name" string'),
        ('<tool_call>{"name": "f", "arguments": [1]}</tool_call>', "must be a JSON object, got list"),
        ('<tool_call>{"name": "f", "arguments": "{oops"}</tool_call>', "a string that is not valid JSON"),
        ("<tool_call>  </tool_call>", "is empty"),
        ('<tool_call><tool_call>{"name": "f"}</tool_call></tool_call>', "calls cannot be nested"),
    ],
)
def test_hermes_malformed_calls_are_reported_not_dropped(action: str, needle: str) -> None:
    calls = HermesParser().parse(action)
    assert len(calls) == 1 and calls[0].error is not None and needle in calls[0].error, calls
    assert calls[0].start == 0 and calls[0].raw.startswith("<tool_call>")


def test_hermes_nested_call_then_good_call() -> None:
    action = '<tool_call>{"name": "f", <tool_call>{"name": "g"}</tool_call></tool_call>' + call_json("h", {})
    calls = HermesParser().parse(action)
    assert [c.error is None for c in calls] == [False, True] and calls[1].name == "h"


def test_hermes_truncated_after_good_call() -> None:
    calls = HermesParser().parse(call_json("f", {}) + '<tool_call>{"name": "g", "argu')
    assert calls[0] == ToolCall("f", {}, call_json("f", {}), 0, None)
    assert calls[1].error is not None and "never closed" in calls[1].error


def test_hermes_and_qwen_outputs() -> None:
    outs = [ToolOutput("3\n", name="add"), ToolOutput("boom", True, "neg")]
    assert HermesParser().format_outputs(outs) == [
        {"role": "tool", "content": "<tool_response>\n3\n</tool_response>"},
        {"role": "tool", "content": "<tool_response>\nboom\n</tool_response>"},
    ]
    qwen = get_parser("qwen")
    assert qwen.name == "qwen" and qwen.format_outputs(outs) == [
        {"role": "tool", "content": "3"},
        {"role": "tool", "content": "boom"},
    ]


def test_hermes_describes_tools_as_json() -> None:
    schema = {"type": "function", "function": {"name": "add", "description": "Add.", "parameters": {"type": "object"}}}
    text = HermesParser().describe_tools([schema])
    assert "<tools>\n" + json.dumps(schema) + "\n</tools>" in text and "<tool_call>" in text


def test_get_parser() -> None:
    assert isinstance(get_parser("retool"), ReToolParser)
    assert get_parser("hermes").name == "hermes"
    p = HermesParser()
    assert get_parser(p) is p
    with pytest.raises(ConfigError, match="unknown tool-call parser 'json'"):
        get_parser("json")
    with pytest.raises(ConfigError, match="not a ToolCallParser"):
        get_parser(object())  # type: ignore[arg-type]
