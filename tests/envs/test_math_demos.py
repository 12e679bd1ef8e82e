"""Warm-up demonstrations for the harder math (agentrl.envs.math_demos): played through
MathTool-v0 itself, imperfect in the documented shares, and the text-only ones on the same
problems."""

from __future__ import annotations

from fractions import Fraction

from agentrl.envs.math_demos import boxed, text_demonstrations, tool_demonstrations
from agentrl.envs.math_envs import MATH_TOOL_PROMPT
from agentrl.envs.rewards import extract_boxed


def _value(boxed_text: str) -> Fraction:
    """The number in a ``\\boxed{}`` this module writes (``-\\frac{5}{12}``, ``17``)."""
    t = boxed_text.replace("\\frac{", "").replace("}{", "/").rstrip("}")
    return Fraction(t)


def test_tool_demonstrations_are_real_episodes_with_their_imperfections() -> None:
    convs = tool_demonstrations(200, seed=1)
    text = text_demonstrations(200, seed=1)
    assert len(convs) == len(text) == 200
    direct = fixed = wrong_copy = 0
    for conv, plain in zip(convs, text):
        assert conv[0]["role"] == "system" and conv[0]["content"].startswith(MATH_TOOL_PROMPT)
        assert conv[1] == plain[1]  # the same problem in both formats
        truth = _value(extract_boxed(plain[-1]["content"]))
        final = conv[-1]
        assert final["role"] == "assistant" and "<code>" not in final["content"]
        said = _value(extract_boxed(final["content"]))
        tools = [m["content"] for m in conv if m["role"] == "tool"]
        if not tools:
            direct += 1
            assert said != truth  # a guess, wrong on purpose
            continue
        assert all(m.startswith("<interpreter>\n") for m in tools)
        if len(tools) == 2:
            fixed += 1
            assert "Error" in tools[0] and "Error" not in tools[1]  # the first block failed, the fix ran
        shown = tools[-1].removeprefix("<interpreter>\n").removesuffix("\n</interpreter>")
        computed = Fraction(shown.removeprefix("Fraction(").removesuffix(")").replace(", ", "/"))
        assert computed == truth, (conv, shown)  # the interpreter really computed the answer
        wrong_copy += said != truth
    assert 20 <= direct <= 60 and 25 <= fixed <= 75 and 15 <= wrong_copy <= 55, (direct, fixed, wrong_copy)


def test_boxed_writes_fractions_as_latex() -> None:
    assert boxed("-7/4") == "\\boxed{-\\frac{7}{4}}" and boxed("12") == "\\boxed{12}"
