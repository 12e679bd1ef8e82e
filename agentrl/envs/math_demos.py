"""Synthetic, imperfect warm-up demonstrations for the harder math (``synthetic:math``), in both
formats, so that code-interpreter RL and text-only RL start from the same SFT budget.

- :func:`tool_demonstrations`: ``agentrl/MathTool-v0`` episodes in the ReTool format. The
  assistant writes Python between ``<code>`` and ``</code>``, reads the ``<interpreter>`` output
  and answers ``\\boxed{}``. Each conversation is played through the environment itself (its
  system prompt, its tool messages, the interpreter's real output, code run in this process:
  the code is ours). Imperfect on purpose: a share answers without code (a guess with one digit
  changed), a share first writes code that fails and then fixes it (the recovery ReTool
  measures), and a share copies the interpreter's value into ``\\boxed{}`` with a digit changed.
- :func:`text_demonstrations`: the same problems for ``agentrl/Math-v0``, solved in words, step
  by step, without a tool (:func:`solution_steps`: the common denominator, the two price changes,
  the partial products of a long multiplication, elimination in a system), then the answer in
  ``\\boxed{}``. Imperfect in the same shares as the tool ones: some answer at once with a wrong
  guess, some copy the last value wrongly into ``\\boxed{}``.

The problems are ``synthetic:math`` rows drawn with ``seed + 7919`` (other problems than the
default training rows, from the same templates).
"""

from __future__ import annotations

import math
import random
import re
from fractions import Fraction
from typing import Any


__all__ = ["boxed", "solution_code", "solution_steps", "text_demonstrations", "tool_demonstrations"]


def boxed(answer: str) -> str:
    """``\\boxed{}`` of an exact answer: ``"-7/4"`` -> ``\\boxed{-\\frac{7}{4}}``, ``"12"`` -> ``\\boxed{12}``."""
    if "/" in answer:
        p, q = answer.split("/")
        sign, p = ("-", p[1:]) if p.startswith("-") else ("", p)
        return f"\\boxed{{{sign}\\frac{{{p}}}{{{q}}}}}"
    return f"\\boxed{{{answer}}}"


def solution_code(row: dict[str, Any]) -> str:
    """Python that prints ``row``'s answer, from its question (a ``synthetic:math`` row with its
    ``template``); the last bare expression is what the interpreter prints."""
    q, template = row["question"], row["template"]
    if template in ("fractions", "large"):
        expr = re.fullmatch(r"Compute (.+?)\..*", q).group(1)  # type: ignore[union-attr]
        if template == "large":
            return expr
        return "from fractions import Fraction\n" + re.sub(r"(\d+)/(\d+)", r"Fraction(\1, \2)", expr)
    if template == "percent":
        price, up, down = re.findall(r"\d+", q)[:3]
        return (f"from fractions import Fraction\nprice = {price} * Fraction(100 + {up}, 100)\n"
                f"price = price * Fraction(100 - {down}, 100)\nprice")
    if template == "system":
        m = re.fullmatch(r"Solve the system (.+) and (.+)\. What is (.+)\?", q)
        e1, e2, target = m.groups()  # type: ignore[union-attr]

        def eq(text: str) -> str:
            lhs, rhs = text.split(" = ")
            return f"sp.Eq({lhs.replace('x', '*x').replace('y', '*y')}, {rhs})"

        return ("import sympy as sp\nx, y = sp.symbols('x y')\n"
                f"s = sp.solve([{eq(e1)}, {eq(e2)}], [x, y])\n{target.replace('2y', '2*y').replace('x', 's[x]').replace('y', 's[y]')}")
    raise ValueError(f"no solution code for template {template!r}")


def _wrong(answer: str, rng: random.Random) -> str:
    """``answer`` with one of its digits changed (a sign or a fraction bar is never touched, and
    no number gains a leading zero)."""
    i = rng.choice([k for k, ch in enumerate(answer) if ch.isdigit()])
    starts = (i == 0 or not answer[i - 1].isdigit()) and i + 1 < len(answer) and answer[i + 1].isdigit()
    digits = [d for d in "0123456789" if d != answer[i] and not (starts and d == "0")]
    return answer[:i] + rng.choice(digits) + answer[i + 1:]


def _broken(code: str, rng: random.Random) -> str:
    """``code`` with a mistake the interpreter reports: a misspelt name or a missing import."""
    if "import" in code and rng.random() < 0.5:
        return "\n".join(line for line in code.splitlines() if "import" not in line)
    return code.replace("Fraction(", "Fractions(", 1) if "Fraction(" in code else "reslt = " + code.splitlines()[-1] + "\nresult"


async def _play(env: Any, row: dict[str, Any], actions: list[str]) -> list[dict[str, str]]:
    messages, _ = env.reset(options={"row": row})
    messages = list(messages)
    for action in actions:
        messages.append({"role": "assistant", "content": action})
        obs, _, terminated, truncated, _ = await env.astep(action)
        messages.extend(obs)
        if terminated or truncated:
            break
    return messages


def tool_demonstrations(
    n: int, seed: int = 0, *, p_direct: float = 0.2, p_fix: float = 0.25, p_copy_error: float = 0.2,
) -> list[list[dict[str, str]]]:
    """``n`` MathTool-v0 conversations (role/content messages; see the module docstring). With
    probability ``p_direct`` the assistant answers at once with a wrong guess; otherwise it
    computes with code (first a failing block, then the fix, with probability ``p_fix``) and
    answers, copying the value wrongly with probability ``p_copy_error``."""
    import anyio

    from agentrl.envs.math_envs import MathToolEnv
    from agentrl.envs.math_tasks import MATH_TASKS
    from agentrl.sandbox.testing import FakeSessionSandbox

    rng = random.Random(seed)
    rows = MATH_TASKS["math"](n, seed + 7919)

    async def main() -> list[list[dict[str, str]]]:
        env = MathToolEnv(sandbox=FakeSessionSandbox(), max_turns=4)
        convs = []
        try:
            for row in rows:
                answer = row["answer"]
                if rng.random() < p_direct:
                    actions = [f"The answer is {boxed(_wrong(answer, rng))}."]
                else:
                    code = solution_code(row)
                    actions = [f"Let me compute it. <code>{_broken(code, rng)}</code>",
                               f"That failed; let me fix it. <code>{code}</code>"] if rng.random() < p_fix else [
                               f"Let me compute it. <code>{code}</code>"]
                    copied = _wrong(answer, rng) if rng.random() < p_copy_error else answer
                    actions.append(f"So the answer is {boxed(copied)}.")
                convs.append(await _play(env, row, actions))
        finally:
            await env.aclose()
        return convs

    return anyio.run(main)


def solution_steps(row: dict[str, Any]) -> str:
    """A worked solution of ``row`` (a ``synthetic:math`` row with its ``template``) in words,
    each step's arithmetic exact, ending at the row's answer (without ``\\boxed{}``)."""
    from agentrl.envs.math_tasks import exact

    q, template = row["question"], row["template"]
    if template == "fractions":
        expr = re.fullmatch(r"Compute (.+?)\..*", q).group(1)  # type: ignore[union-attr]
        terms = [(int(p), int(d)) for p, d in re.findall(r"(\d+)/(\d+)", expr)]
        signs = re.findall(r" ([+-]) ", expr)
        lcm = math.lcm(*(d for _, d in terms))
        scaled = [p * (lcm // d) for p, d in terms]
        total = scaled[0] + sum(v if sign == "+" else -v for sign, v in zip(signs, scaled[1:]))
        value = Fraction(total, lcm)
        over = ", ".join(f"{p}/{d} = {v}/{lcm}" for (p, d), v in zip(terms, scaled))
        combined = f"{scaled[0]} " + " ".join(f"{sign} {v}" for sign, v in zip(signs, scaled[1:]))
        reduced = f" = {exact(value)}" if value.denominator != lcm else ""
        return f"Over the common denominator {lcm}: {over}. Then {combined} = {total}, so the result is {total}/{lcm}{reduced}."
    if template == "percent":
        price, up, down = (int(v) for v in re.findall(r"\d+", q)[:3])
        raised = price * Fraction(100 + up, 100)
        final = raised * Fraction(100 - down, 100)
        return (f"Raised by {up}%: {price} * {100 + up}/100 = {exact(raised)}. "
                f"Lowered by {down}%: {exact(raised)} * {100 - down}/100 = {exact(final)}.")
    if template == "large":
        a, b, c = (int(v) for v in re.fullmatch(r"Compute (\d+)\*(\d+) - (\d+)\.", q).groups())  # type: ignore[union-attr]
        parts = [int(d) * 10 ** i for i, d in enumerate(reversed(str(b))) if d != "0"][::-1]
        products = [a * p for p in parts]
        return (f"{a} * {b} = " + " + ".join(f"{a} * {p}" for p in parts) + " = " + " + ".join(str(v) for v in products)
                + f" = {a * b}. Then {a * b} - {c} = {a * b - c}.")
    if template == "system":
        m = re.fullmatch(r"Solve the system (-?\d+)x ([+-]) (\d+)y = (-?\d+) and (-?\d+)x ([+-]) (\d+)y = (-?\d+)\. What is (.+)\?", q)
        a, sb, b, e, c, sd, d, f, asked = m.groups()  # type: ignore[union-attr]
        a, b, e, c, d, f = int(a), int(b) * (1 if sb == "+" else -1), int(e), int(c), int(d) * (1 if sd == "+" else -1), int(f)
        det = a * d - b * c
        x = Fraction(e * d - b * f, det)
        y = (f - c * x) / d if d else (e - a * x) / b
        value = x + 2 * y if asked == "x + 2y" else x * y
        def n(v: int) -> str:  # a factor: negatives in parentheses
            return f"({v})" if v < 0 else str(v)

        return (f"Eliminate y: ({n(a)}*{n(d)} - {n(b)}*{n(c)}) x = {n(e)}*{n(d)} - {n(b)}*{n(f)}, so {det} x = {e * d - b * f} and x = {exact(x)}. "
                f"Then y = {exact(y)}, and {asked} = {exact(value)}.")
    raise ValueError(f"no worked solution for template {template!r}")


def text_demonstrations(
    n: int, seed: int = 0, *, p_direct: float = 0.2, p_copy_error: float = 0.2,
) -> list[list[dict[str, str]]]:
    """``n`` Math-v0 conversations on the same problems as :func:`tool_demonstrations`. With
    probability ``p_direct`` the assistant answers at once with a wrong guess; otherwise it
    solves step by step (:func:`solution_steps`) and answers, copying the value wrongly with
    probability ``p_copy_error``: the same shares as the tool demonstrations."""
    from agentrl.envs.math_envs import MATH_PROMPT
    from agentrl.envs.math_tasks import MATH_TASKS

    rng = random.Random(seed)
    convs = []
    for row in MATH_TASKS["math"](n, seed + 7919):
        answer = row["answer"]
        if rng.random() < p_direct:
            reply = f"The answer is {boxed(_wrong(answer, rng))}."
        else:
            copied = _wrong(answer, rng) if rng.random() < p_copy_error else answer
            reply = f"{solution_steps(row)} So the answer is {boxed(copied)}."
        convs.append([{"role": "system", "content": MATH_PROMPT}, {"role": "user", "content": row["question"]},
                      {"role": "assistant", "content": reply}])
    return convs
