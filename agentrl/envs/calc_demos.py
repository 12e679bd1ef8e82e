"""Synthetic, imperfect tool-use demonstrations for ``agentrl/Calc-v0`` (an SFT warm-up).

Imperfect on purpose, so that RL has something to fix: a fraction of the demonstrations answer
without calling the interpreter (often wrongly), and a fraction copy the interpreter's result
into ``\\boxed{}`` with one digit changed.
"""

from __future__ import annotations

import random

from agentrl.envs.calc import SYSTEM_PROMPT, format_interpreter, generate_problems

__all__ = ["corrupt_digit", "demonstrations", "text_demonstrations"]


def corrupt_digit(value: str, rng: random.Random) -> str:
    """``value`` with one digit replaced by a different one."""
    i = rng.randrange(len(value))
    digits = [d for d in "0123456789" if d != value[i] and not (i == 0 and d == "0")]
    return value[:i] + rng.choice(digits) + value[i + 1 :]


def demonstrations(
    n: int, seed: int = 0, *, p_direct: float = 0.25, p_copy_error: float = 0.3
) -> list[list[dict[str, str]]]:
    """``n`` chat conversations (lists of role/content messages) solving Calc-v0 problems.

    With probability ``p_direct`` the assistant answers at once (a guess: the right answer with
    one digit changed); otherwise it calls ``<code>print(expr)</code>``, sees the interpreter's
    output and answers ``\\boxed{value}``, copying the value wrongly with probability
    ``p_copy_error``. Problems come from ``generate_problems(n, seed + 7919)`` so they differ
    from the default training rows.
    """
    rng = random.Random(seed)
    convs = []
    for row in generate_problems(n, seed + 7919):
        expr = row["question"].removeprefix("Compute ").removesuffix(".")
        value = row["answer"]
        msgs = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": row["question"]}]
        if rng.random() < p_direct:
            msgs.append({"role": "assistant", "content": f"\\boxed{{{corrupt_digit(value, rng)}}}"})
        else:
            copied = corrupt_digit(value, rng) if rng.random() < p_copy_error else value
            msgs += [
                {"role": "assistant", "content": f"<code>print({expr})</code>"},
                {"role": "tool", "content": format_interpreter(value)},
                {"role": "assistant", "content": f"\\boxed{{{copied}}}"},
            ]
        convs.append(msgs)
    return convs


def text_demonstrations(n: int, seed: int = 0) -> list[list[dict[str, str]]]:
    """``n`` text-only conversations for the same problems, in ``agentrl/Math-v0``'s format: the
    assistant states the (correct) answer in ``\\boxed{}`` without any tool — the baseline that
    code-interpreter RL is compared with."""
    from agentrl.envs.math_envs import MATH_PROMPT

    convs = []
    for row in generate_problems(n, seed + 7919):
        convs.append(
            [
                {"role": "system", "content": MATH_PROMPT},
                {"role": "user", "content": row["question"]},
                {"role": "assistant", "content": f"\\boxed{{{row['answer']}}}"},
            ]
        )
    return convs
