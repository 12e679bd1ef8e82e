"""The harder synthetic math (agentrl.envs.math_tasks): every answer re-derived with sympy from the
question's own text (independently of the generator's check), splits that never share a
question, and an out-of-distribution set that shares none with training."""

from __future__ import annotations

import re

import pytest
import sympy

from agentrl.envs.data import load_rows
from agentrl.envs.math_tasks import MATH_TASKS, in_split

x, y = sympy.symbols("x y")


def _solve_from_text(question: str) -> sympy.Rational:
    """The answer of ``question``, worked out from its text alone."""
    if m := re.fullmatch(r"Compute (.+?)\.( Give the answer as a reduced fraction\.)?", question):
        return sympy.sympify(m.group(1), rational=True)
    if m := re.fullmatch(r"A jacket costs (\d+) dollars\. Its price is raised by (\d+)% and the new price is then "
                         r"lowered by (\d+)%\. What is the final price in dollars\? Give an exact number\.", question):
        p, up, down = (sympy.Integer(v) for v in m.groups())
        return p * (1 + up / 100) * (1 - down / 100)
    if m := re.fullmatch(r"Solve the system (.+) and (.+)\. What is (.+)\?", question):
        eqs = [sympy.Eq(*(sympy.sympify(side.replace("x", "*x").replace("y", "*y")) for side in e.split("=")))
               for e in m.groups()[:2]]
        [sol] = sympy.solve(eqs, [x, y], dict=True)
        return sympy.sympify(m.group(3).replace("2y", "2*y")).subs(sol)
    if m := re.fullmatch(r"A shop sells pens at (\d+) dollars and notebooks at (\d+) dollars\. Sam buys (\d+) times as many "
                         r"pens as notebooks and pays (\d+) dollars in all\. How many pens does Sam buy\?", question):
        pen, book, ratio, total = (sympy.Integer(v) for v in m.groups())
        [sol] = sympy.solve([book * x + pen * y - total, y - ratio * x], [x, y], dict=True)
        return sol[y]
    raise AssertionError(f"no solver for {question!r}")


@pytest.mark.parametrize("task", sorted(MATH_TASKS))
def test_every_answer_is_what_sympy_finds_from_the_question_alone(task: str) -> None:
    rows = load_rows(f"synthetic:{task}", limit=40, seed=3)
    assert len(rows) == 40 and len({r["question"] for r in rows}) == 40
    for r in rows:
        assert sympy.Rational(r["answer"]) == _solve_from_text(r["question"]), r


def test_each_template_appears_in_the_mixes() -> None:
    assert {r["template"] for r in load_rows("synthetic:math", limit=200, seed=0)} == {"fractions", "percent", "large", "system"}
    assert {r["template"] for r in load_rows("synthetic:math_ood", split="test", limit=100, seed=0)} == {"multistep", "system", "large"}


@pytest.mark.parametrize("task", ["math", "math_ood", "fractions", "system"])
def test_no_two_splits_share_a_question(task: str) -> None:
    splits = {s: {r["question"] for r in load_rows(f"synthetic:{task}", split=s, limit=150, seed=0)} for s in ("train", "test", "validation")}
    assert not splits["train"] & splits["test"] and not splits["train"] & splits["validation"]
    assert all(in_split(q, "train") for q in splits["train"]) and not any(in_split(q, "train") for q in splits["test"])


def test_the_out_of_distribution_set_shares_nothing_with_training() -> None:
    train = {r["question"] for r in load_rows("synthetic:math", limit=400, seed=0)}
    ood = load_rows("synthetic:math_ood", split="test", limit=200, seed=0)
    assert not train & {r["question"] for r in ood}
    big = [r for r in ood if r["template"] == "large"]
    assert big and all(int(re.match(r"Compute (\d+)\*", r["question"]).group(1)) >= 100_000 for r in big)  # wider than training's


def test_the_same_seed_gives_the_same_rows() -> None:
    assert load_rows("synthetic:math", limit=30, seed=7) == load_rows("synthetic:math", limit=30, seed=7)
    assert load_rows("synthetic:math", limit=30, seed=7) != load_rows("synthetic:math", limit=30, seed=8)
