"""Warm-up demonstrations for the harder math (agentrl.envs.math_demos): played through
MathTool-v0 itself, imperfect in the documented shares, and the text-only ones on the same
problems."""

from __future__ import annotations

from fractions import Fraction

from agentrl.envs.math_demos import boxed, solution_steps, text_demonstrations, tool_demonstrations
from agentrl.envs.math_envs import MATH_PROMPT, MATH_TOOL_PROMPT
from agentrl.envs.math_tasks import MATH_TASKS
from agentrl.envs.rewards import extract_boxed


def _value(boxed_text: str) -> Fraction:
    """The number in a ``\\boxed{}`` this module writes (``-\\frac{5}{12}``, ``17``)."""
    t = boxed_text.replace("\\frac{", "").replace("}{", "/").rstrip("}")
    return Fraction(t)


def test_tool_demonstrations_are_real_episodes_with_their_imperfections() -> None:
    convs = tool_demonstrations(200, seed=1)
    text = text_demonstrations(200, seed=1)
    rows = MATH_TASKS["math"](200, 1 + 7919)  # the problems both draw
    assert len(convs) == len(text) == 200
    direct = fixed = wrong_copy = 0
    for conv, plain, row in zip(convs, text, rows):
        assert conv[0]["role"] == "system" and conv[0]["content"].startswith(MATH_TOOL_PROMPT)
        assert conv[1] == plain[1] == {"role": "user", "content": row["question"]}  # the same problem in both formats
        truth = Fraction(row["answer"])
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


def test_text_demonstrations_solve_step_by_step_with_the_same_imperfections() -> None:
    rows = MATH_TASKS["math"](200, 1 + 7919)
    direct = wrong_copy = 0
    for conv, row in zip(text_demonstrations(200, seed=1), rows):
        assert [m["role"] for m in conv] == ["system", "user", "assistant"] and conv[0]["content"] == MATH_PROMPT
        reply, truth = conv[-1]["content"], Fraction(row["answer"])
        said = _value(extract_boxed(reply))
        if reply.startswith("The answer is"):  # answered at once: a guess, wrong on purpose
            direct += 1
            assert said != truth
            continue
        assert reply.startswith(solution_steps(row)) and "<code>" not in reply  # worked in words, no tool
        wrong_copy += said != truth
    # the shares of tool_demonstrations: 20 % guesses, 20 % of the rest copied wrongly
    assert 20 <= direct <= 60 and 15 <= wrong_copy <= 55, (direct, wrong_copy)


def test_every_worked_step_is_exact_arithmetic_ending_at_the_answer() -> None:
    """Each ``a op b = c`` of a worked solution is checked here, independently of the solver,
    for every template of ``synthetic:math`` (400 problems)."""
    import re

    rows = MATH_TASKS["math"](400, 7919)
    assert {r["template"] for r in rows} == {"fractions", "percent", "large", "system"}
    number = r"\(?-?\d+(?:/\d+)?\)?"
    for row in rows:
        steps = solution_steps(row)
        assert steps.endswith(f" {row['answer']}.") or steps.endswith(f"= {row['answer']}."), (row, steps)
        ev = lambda text: eval(re.sub(r"(\d+)", r"F(\1)", text), {"__builtins__": {}, "F": Fraction})  # exact  # noqa: E731
        if row["template"] == "system":  # (det) x = (num), so D x = N and x = X. Then y = Y: both equations hold
            m = re.fullmatch(r"Eliminate y: \((.+)\) x = (.+), so (-?\d+) x = (-?\d+) and x = (\S+)\. Then y = (\S+), and .+ = (\S+)\.", steps)
            assert m, steps
            det, num, d_, n_, x, y, value = m.groups()
            assert ev(det) == int(d_) and ev(num) == int(n_) and Fraction(int(n_), int(d_)) == Fraction(x)
            for lhs, rhs in re.findall(r"(-?\d+x [+-] \d+y) = (-?\d+)", row["question"]):
                assert ev(lhs.replace("x", f"*({x})").replace("y", f"*({y})")) == int(rhs), (row["question"], steps)
            continue
        # every chain 'A = B = C' of plain arithmetic: each side evaluates, exactly, to the same value
        chains = re.findall(rf"((?:{number}(?: [*+-] {number})* = )+{number})(?=[.,]|$| and| so)", steps)
        assert chains, (row["question"], steps)
        for chain in chains:
            assert len({ev(side) for side in chain.split(" = ")}) == 1, (row["question"], chain)
