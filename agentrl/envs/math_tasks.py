"""Harder synthetic math for ReTool-style runs: problems a small model should not solve in its head,
with exact answers checked by sympy when they are made, and an out-of-distribution set.

Templates (each returns the question, a sympy expression or equation system for the check, and the
exact answer):

- ``fractions``: ``Compute 3/4 + 5/6 - 2/9.`` -> ``"49/36"``;
- ``percent``: a price raised then lowered by percentages -> its exact final value;
- ``large``: ``Compute 48213*7391 - 125647.`` (numbers too large to multiply in the head);
- ``system``: two linear equations in ``x`` and ``y`` -> the value of ``x + 2y`` (or ``x*y``);
- ``multistep``: a purchase with two kinds of items and a total, solved for one count.

Task names for ``load_rows("synthetic:<name>")`` (:data:`MATH_TASKS`):

- ``math``: the in-distribution mix of ``fractions``, ``percent``, ``large`` and ``system`` with
  the small parameter ranges;
- ``math_ood``: what training never sees: the ``multistep`` template, and ``system`` and ``large``
  with wider parameter ranges and a different question (``x*y``);
- each template alone, by its name.

Splits never share a question: a row belongs to the ``train`` split when the CRC-32 of its
question is not a multiple of :data:`HELD_OUT_EVERY`, and to every other split when it is
(:func:`in_split`); generators draw until they have ``n`` rows of their split.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from agentrl.errors import DataError

__all__ = ["HELD_OUT_EVERY", "MATH_TASKS", "exact", "in_split", "math_rows"]

HELD_OUT_EVERY = 5
"""One question in this many (by its CRC-32) belongs to the held-out splits, the rest to ``train``."""

Template = Callable[[random.Random, bool], tuple[str, str, Fraction]]
"""``template(rng, wide)``: ``(question, check, answer)``; ``check`` is a sympy expression whose
value is the answer, or ``"eqs: e1; e2 | target"`` (equations in x and y, and the expression of
their solution that is the answer); ``wide``: the out-of-distribution parameter ranges."""


def in_split(question: str, split: str) -> bool:
    """Whether ``question`` belongs to ``split`` (``train``, or any held-out split)."""
    held_out = zlib.crc32(question.encode()) % HELD_OUT_EVERY == 0
    return held_out != (split == "train")


def exact(value: Fraction) -> str:
    """``value`` as a row's answer is written: ``12``, ``-7/4``."""
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def _fractions(rng: random.Random, wide: bool) -> tuple[str, str, Fraction]:
    dens = [2, 3, 4, 5, 6, 7, 8, 9, 10, 12] + ([11, 13, 15, 16] if wide else [])
    terms = [(rng.randint(1, d - 1), d) for d in rng.sample(dens, 3)]
    signs = [rng.choice(["+", "-"]) for _ in range(2)]
    text = f"{terms[0][0]}/{terms[0][1]} {signs[0]} {terms[1][0]}/{terms[1][1]} {signs[1]} {terms[2][0]}/{terms[2][1]}"
    value = Fraction(*terms[0])
    for sign, (p, q) in zip(signs, terms[1:]):
        value = value + Fraction(p, q) if sign == "+" else value - Fraction(p, q)
    return f"Compute {text}. Give the answer as a reduced fraction.", text, value


def _percent(rng: random.Random, wide: bool) -> tuple[str, str, Fraction]:
    price = rng.randint(40, 400) * (5 if wide else 1)
    up, down = rng.choice([5, 10, 12, 15, 20, 25, 30]), rng.choice([5, 10, 15, 20, 25, 40])
    q = (f"A jacket costs {price} dollars. Its price is raised by {up}% and the new price is then lowered by "
         f"{down}%. What is the final price in dollars? Give an exact number.")
    return q, f"{price}*(1 + {up}/100)*(1 - {down}/100)", price * Fraction(100 + up, 100) * Fraction(100 - down, 100)


def _large(rng: random.Random, wide: bool) -> tuple[str, str, Fraction]:
    lo, hi = (100_000, 999_999) if wide else (10_000, 99_999)
    a, b, c = rng.randint(lo, hi), rng.randint(1_000, 9_999), rng.randint(10_000, 999_999)
    return f"Compute {a}*{b} - {c}.", f"{a}*{b} - {c}", Fraction(a * b - c)


def _system(rng: random.Random, wide: bool) -> tuple[str, str, Fraction]:
    span = 40 if wide else 12
    while True:
        x, y = rng.randint(-span, span), rng.randint(-span, span)
        a, b, c, d = (rng.randint(-9, 9) for _ in range(4))
        if a * d - b * c != 0 and 0 not in (a, d):
            break
    e, f = a * x + b * y, c * x + d * y

    def eq(p: int, q: int, r: int) -> str:
        return f"{p}x {'+' if q >= 0 else '-'} {abs(q)}y = {r}"

    if wide:
        target, value, asked = "x*y", Fraction(x * y), "x*y"
    else:
        target, value, asked = "x + 2*y", Fraction(x + 2 * y), "x + 2y"
    q = f"Solve the system {eq(a, b, e)} and {eq(c, d, f)}. What is {asked}?"
    return q, f"eqs: {a}*x + {b}*y - {e}; {c}*x + {d}*y - {f} | {target}", value


def _multistep(rng: random.Random, wide: bool) -> tuple[str, str, Fraction]:
    pen, book, ratio = rng.randint(2, 9), rng.randint(10, 30), rng.randint(2, 5)
    books = rng.randint(2, 12)
    total = books * book + ratio * books * pen
    q = (f"A shop sells pens at {pen} dollars and notebooks at {book} dollars. Sam buys {ratio} times as many pens "
         f"as notebooks and pays {total} dollars in all. How many pens does Sam buy?")
    return q, f"eqs: {book}*x + {pen}*y - {total}; y - {ratio}*x | y", Fraction(ratio * books)


def _check(task: str, question: str, check: str, value: Fraction) -> None:
    """Raise DataError unless sympy, from the question's own numbers, finds ``value``."""
    import sympy

    if check.startswith("eqs: "):
        eqs_text, target = check.removeprefix("eqs: ").split(" | ")
        x, y = sympy.symbols("x y")
        solution = sympy.solve([sympy.sympify(e) for e in eqs_text.split("; ")], [x, y], dict=True)
        got = [sympy.sympify(target).subs(s) for s in solution]
        ok = got == [sympy.Rational(value.numerator, value.denominator)]
    else:
        ok = sympy.sympify(check, rational=True) == sympy.Rational(value.numerator, value.denominator)
    if not ok:
        raise DataError(f"synthetic:{task}: the generated answer {exact(value)!r} of {question!r} is wrong (sympy: {check})")


_IN: dict[str, Template] = {"fractions": _fractions, "percent": _percent, "large": _large, "system": _system}
_OOD: dict[str, Template] = {"multistep": _multistep, "system": _system, "large": _large}


def math_rows(templates: dict[str, Template], wide: bool, name: str, n: int, seed: int, split: str) -> list[dict[str, Any]]:
    """``n`` rows of ``split`` drawn from ``templates`` (``wide``: their out-of-distribution
    ranges), each checked with sympy; ``{"question", "answer", "task", "template"}``."""
    rng = random.Random(f"{name}:{seed}")
    keys = sorted(templates)
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    tries = 0
    while len(rows) < n:
        tries += 1
        if tries > 200 * (n + 10):
            raise DataError(f"synthetic:{name}: could not draw {n} distinct {split!r} problems")
        key = rng.choice(keys)
        question, check, value = templates[key](rng, wide)
        if question in seen or not in_split(question, split):
            continue
        _check(name, question, check, value)
        seen.add(question)
        rows.append({"question": question, "answer": exact(value), "task": name, "template": key})
    return rows


def _task(templates: dict[str, Template], wide: bool, name: str) -> Callable[..., list[dict[str, Any]]]:
    def generate(n: int, seed: int, split: str = "train") -> list[dict[str, Any]]:
        return math_rows(templates, wide, name, n, seed, split)

    generate.__doc__ = f"``synthetic:{name}``: {', '.join(sorted(templates))}" + (" (out-of-distribution ranges)" if wide else "")
    generate.takes_split = True  # type: ignore[attr-defined]  # load_rows passes the split, not a split seed
    return generate


MATH_TASKS: dict[str, Callable[..., list[dict[str, Any]]]] = {
    "math": _task(_IN, False, "math"),
    "math_ood": _task(_OOD, True, "math_ood"),
    **{k: _task({k: t}, False, k) for k, t in _IN.items()},
    "multistep": _task({"multistep": _multistep}, False, "multistep"),
}
"""The harder math tasks by name (see the module docstring)."""
