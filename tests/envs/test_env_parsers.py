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
