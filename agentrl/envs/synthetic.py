"""Synthetic tasks with exact answers, so that everything runs offline.

Each generator returns ``n`` rows ``{"question": str, "answer": str, "task": str}``, the same for
the same seed. Answers are exact (integers or reduced fractions ``"p/q"``) and every row is
checked with sympy when it is made (a generator bug raises instead of shipping a wrong answer).

- ``calc``: ``Compute 347*58+91.`` (:func:`agentrl.envs.calc.generate_problems`).
- ``turns``: episodes of 1 to 8 turns for ``agentrl/Turns-v0`` (:func:`agentrl.envs.turns.turn_rows`;
  not checked with sympy: nothing to compute).
- ``linear``: one linear equation in ``x`` with integer coefficients, e.g.
  ``Solve for x: 7x - 12 = 3x + 5.`` -> ``"17/4"``.
- ``word``: short word problems over a few templates (shopping, sharing, rates, ages), e.g.
  ``Mia buys 4 notebooks at 3 dollars each and a pen for 2 dollars. She pays with a 20-dollar
  bill. How many dollars of change does she get?`` -> ``"6"``.

:data:`SYNTHETIC_TASKS` maps the names used by ``load_rows("synthetic:<name>")`` to generators;
the harder math tasks (``math``, ``math_ood`` and their templates) are in
:mod:`agentrl.envs.math_tasks`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from agentrl.envs.math_tasks import MATH_TASKS
from agentrl.errors import DataError

__all__ = ["SYNTHETIC_TASKS", "linear_equations", "word_problems", "calc_problems", "format_fraction"]


def format_fraction(value: Fraction) -> str:
    """``"5"`` for an integer, ``"-17/4"`` for a reduced fraction."""
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def _side(a: int, b: int) -> str:
    """``a*x + b`` written as a person would: ``7x - 12``, ``-x``, ``5``, ``x + 3``."""
    terms = []
    if a:
        coef = "" if a == 1 else "-" if a == -1 else str(a)
        terms.append(f"{coef}x")
    if b or not terms:
        if terms:
            terms.append(f"- {-b}" if b < 0 else f"+ {b}")
        else:
            terms.append(str(b))
    return " ".join(terms)


def _sympy_check(task: str, question: str, expr_text: str, answer: str, solve_for_x: bool = False) -> None:
    """Raise DataError unless sympy agrees that ``expr_text`` (an equation ``lhs = rhs`` in x, or
    an arithmetic expression) has exactly the value ``answer``."""
    import sympy

    expected = sympy.Rational(answer)
    if solve_for_x:
        x = sympy.Symbol("x")
        lhs, rhs = expr_text.split("=")
        solutions = sympy.solve(sympy.Eq(sympy.sympify(lhs), sympy.sympify(rhs)), x)
        ok = solutions == [expected]
    else:
        ok = sympy.sympify(expr_text, rational=True) == expected  # (nsimplify turns some rationals into surds)
    if not ok:
        raise DataError(f"synthetic:{task}: the generated answer {answer!r} of {question!r} is wrong (sympy: {expr_text})")


def linear_equations(n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` rows ``Solve for x: a x + b = c x + d.`` with integer coefficients in [-12, 12]
    (``a != c``); the answer is the exact solution, an integer about half of the time."""
    rng = random.Random(seed)
    rows = []
    while len(rows) < n:
        a, c = rng.randint(-12, 12), rng.randint(-12, 12)
        if a == c or a == 0:
            continue
        if rng.random() < 0.5:  # make an integer solution
            x = rng.randint(-20, 20)
            b = rng.randint(-30, 30)
            d = (a - c) * x + b
        else:
            b, d = rng.randint(-30, 30), rng.randint(-30, 30)
        if rng.random() < 0.35:
            c = 0
            if a == 0:
                continue
        value = Fraction(d - b, a - c)
        answer = format_fraction(value)
        question = f"Solve for x: {_side(a, b)} = {_side(c, d)}."
        _sympy_check("linear", question, f"{a}*x + ({b}) = {c}*x + ({d})", answer, solve_for_x=True)
        rows.append({"question": question, "answer": answer, "task": "linear"})
    return rows


_NAMES = ["Mia", "Leo", "Ava", "Noah", "Zoe", "Omar", "Ines", "Ravi", "Lena", "Tom"]
_ITEMS = [("notebook", "notebooks"), ("apple", "apples"), ("ticket", "tickets"), ("marker", "markers")]


def _shopping(rng: random.Random) -> tuple[str, str, Fraction]:
    name = rng.choice(_NAMES)
    item, items = rng.choice(_ITEMS)
    k, price, extra = rng.randint(2, 9), rng.randint(2, 15), rng.randint(1, 9)
    total = k * price + extra
    bill = next(b for b in (10, 20, 50, 100, 200) if b >= total)
    q = (
        f"{name} buys {k} {items} at {price} dollars each and a pen for {extra} dollars. "
        f"{name} pays with a {bill}-dollar bill. How many dollars of change does {name} get?"
    )
    return q, f"{bill} - ({k}*{price} + {extra})", Fraction(bill - total)


def _sharing(rng: random.Random) -> tuple[str, str, Fraction]:
    name = rng.choice(_NAMES)
    item, items = rng.choice(_ITEMS)
    friends, each, left = rng.randint(2, 8), rng.randint(2, 12), rng.randint(0, 9)
    start = friends * each + left
    q = (
        f"{name} has {start} {items} and gives {each} to each of {friends} friends. "
        f"How many {items} does {name} have left?"
    )
    return q, f"{start} - {friends}*{each}", Fraction(left)


def _rate(rng: random.Random) -> tuple[str, str, Fraction]:
    name = rng.choice(_NAMES)
    speed, hours, minutes = rng.randint(3, 80), rng.randint(1, 5), rng.choice([0, 15, 20, 30, 40, 45])
    q = (
        f"{name} travels at a constant {speed} kilometres per hour for {hours} hours and {minutes} minutes. "
        "How many kilometres does the trip cover?"
    )
    return q, f"{speed}*({hours} + {minutes}/60)", speed * (hours + Fraction(minutes, 60))


def _ages(rng: random.Random) -> tuple[str, str, Fraction]:
    a, b = rng.sample(_NAMES, 2)
    child, factor, years = rng.randint(3, 15), rng.randint(2, 5), rng.randint(1, 10)
    q = (
        f"{a} is {factor} times as old as {b}, who is {child} years old. "
        f"How old will {a} be in {years} years?"
    )
    return q, f"{factor}*{child} + {years}", Fraction(factor * child + years)


def _fraction_of(rng: random.Random) -> tuple[str, str, Fraction]:
    name = rng.choice(_NAMES)
    den = rng.choice([2, 3, 4, 5, 6, 8])
    num = rng.randint(1, den - 1)
    whole = den * rng.randint(2, 12)
    q = (
        f"A jar holds {whole} marbles. {name} takes {num}/{den} of them, then puts 3 back. "
        "How many marbles are in the jar now?"
    )
    return q, f"{whole} - {whole}*{num}/{den} + 3", whole - whole * Fraction(num, den) + 3


_WORD_TEMPLATES: list[Callable[[random.Random], tuple[str, str, Fraction]]] = [_shopping, _sharing, _rate, _ages, _fraction_of]


def word_problems(n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` short word problems drawn from five templates; answers are exact (the trip
    distance may be a fraction, e.g. ``"175/2"``). Each answer is computed with Python
    fractions and checked against sympy's evaluation of the problem's expression."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        question, expr, value = rng.choice(_WORD_TEMPLATES)(rng)
        answer = format_fraction(value)
        _sympy_check("word", question, expr, answer)
        rows.append({"question": question, "answer": answer, "task": "word"})
    return rows


def calc_problems(n: int, seed: int) -> list[dict[str, Any]]:
    """The ``calc`` task: :func:`agentrl.envs.calc.generate_problems` (rows without ``"task"``)."""
    from agentrl.envs.calc import generate_problems

    return [dict(r) for r in generate_problems(n, seed)]


def turns_rows(n: int, seed: int) -> list[dict[str, Any]]:
    """The ``turns`` rows of :mod:`agentrl.envs.turns` (episodes of 1 to 8 turns)."""
    from agentrl.envs.turns import turn_rows

    return turn_rows(n, seed)


SYNTHETIC_TASKS: dict[str, Callable[..., list[dict[str, Any]]]] = {
    "calc": calc_problems,
    "turns": turns_rows,
    "linear": linear_equations,
    "word": word_problems,
    **MATH_TASKS,  # harder math with an out-of-distribution set (agentrl.envs.math_tasks)
}
"""``load_rows("synthetic:<name>")`` task names and their ``(n, seed) -> rows`` generators."""
