"""``agentrl/Calc-v0``: compute ``a*b+c`` with a Python interpreter, answer in ``\\boxed{}``.

The smallest ReTool-style task: a 3-digit times a 2-digit number plus a 2-digit number is too much
mental arithmetic for a tiny model, but trivial with one ``<code>print(a*b+c)</code>`` call. An
episode::

    system     SYSTEM_PROMPT
    user       Compute 347*58+91.
    assistant  <code>print(347*58+91)</code>              -> step: tool message, reward 0
    tool       <interpreter>\\n20217\\n</interpreter>
    assistant  The answer is \\boxed{20217}.               -> step: terminated, reward 1.0
"""

from __future__ import annotations

import ast
import random
from typing import TYPE_CHECKING, Any

from agentrl.envs import pyast
from agentrl.envs.base import Message
from agentrl.envs.parsers import extract_boxed
from agentrl.envs.tool_env import ToolEnv
from agentrl.envs.tools import PythonTool
from agentrl.errors import DataError

if TYPE_CHECKING:
    from agentrl.sandbox.base import Sandbox

__all__ = [
    "SYSTEM_PROMPT",
    "CalcEnv",
    "generate_problems",
    "sample_texts",
    "format_interpreter",
    "prepare_code",
    "as_int",
]

SYSTEM_PROMPT = (
    "You solve arithmetic problems with a Python interpreter. "
    "To run Python, write the code between <code> and </code>; "
    "its output comes back between <interpreter> and </interpreter>. "
    "Use the interpreter for the arithmetic, then give the final answer as an integer in \\boxed{}."
)
"""The system message of every Calc-v0 episode."""

MAX_OUTPUT_CHARS = 2000
"""Interpreter output longer than this is cut to its last ``MAX_OUTPUT_CHARS`` characters."""


def generate_problems(n: int, seed: int) -> list[dict[str, str]]:
    """``n`` rows ``{"question": "Compute 347*58+91.", "answer": "20217"}``, the same for the same seed.

    ``a`` has 3 digits, ``b`` and ``c`` 2 digits; the answer is ``a*b+c`` in decimal.
    """
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b, c = rng.randint(100, 999), rng.randint(10, 99), rng.randint(10, 99)
        rows.append({"question": f"Compute {a}*{b}+{c}.", "answer": str(a * b + c)})
    return rows


def sample_texts(n: int, seed: int) -> list[str]:
    """``n`` whole example episodes as ChatML text (``<|im_start|>role\\n...<|im_end|>``), for
    training a tiny model's tokenizer: system prompt, question, a ``<code>`` call, the interpreter's
    answer and a ``\\boxed{}`` final answer, with a few phrasings."""
    rng = random.Random(seed)
    calls = ["<code>print({e})</code>", "<code>{e}</code>", "<code>\nx = {e}\nprint(x)\n</code>"]
    finals = ["The answer is \\boxed{{{v}}}.", "\\boxed{{{v}}}", "So {e} = {v}, and the answer is \\boxed{{{v}}}."]
    texts = []
    for row in generate_problems(n, seed):
        e = row["question"].removeprefix("Compute ").removesuffix(".")
        v = row["answer"]
        msgs = [
            ("system", SYSTEM_PROMPT),
            ("user", row["question"]),
            ("assistant", rng.choice(calls).format(e=e)),
            ("tool", format_interpreter(v)),
            ("assistant", rng.choice(finals).format(e=e, v=v)),
        ]
        texts.append("".join(f"<|im_start|>{r}\n{c}<|im_end|>\n" for r, c in msgs))
    return texts


def as_int(text: str) -> int | None:
    """``text`` as an integer after removing whitespace and commas (``"20,217"`` -> 20217), else None."""
    s = "".join(ch for ch in text if not ch.isspace() and ch != ",")
    if s[:1] in "+-":
        sign, digits = s[:1], s[1:]
    else:
        sign, digits = "", s
    if not digits.isascii() or not digits.isdigit():
        return None
    return int(sign + digits)


def prepare_code(code: str) -> str:
    """The code to run for ``code``: if it is a single expression and never mentions ``print``,
    it is rewritten to print the expression's ``repr`` unless the value is None (as the Python
    REPL does), so ``<code>347*58+91</code>`` shows ``20217``. Anything else runs unchanged."""
    try:
        tree = pyast.parse(code)
    except (SyntaxError, RecursionError, MemoryError):  # too deep to parse: the interpreter says so
        return code  # the interpreter reports the error to the model
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Expr):
        return code
    if any(isinstance(node, ast.Name) and node.id == "print" for node in ast.walk(tree)):
        return code
    try:
        expr = ast.unparse(tree.body[0].value)
    except RecursionError:  # nested too deep to write back: it runs as it is
        return code
    return f"__value = ({expr})\nif __value is not None:\n    print(repr(__value))\n"


def _tail(text: str, limit: int = MAX_OUTPUT_CHARS) -> str:
    return text if len(text) <= limit else "[... output truncated]\n" + text[-limit:]


def format_interpreter(output: str) -> str:
    """The tool message content for ``output``: ``"<interpreter>\\n{output}\\n</interpreter>"``
    (trailing whitespace of ``output`` removed)."""
    return f"<interpreter>\n{output.rstrip()}\n</interpreter>"


class CalcEnv(ToolEnv):
    """``agentrl/Calc-v0``: a calculator task solved with a sandboxed Python interpreter.

    **Row** — ``{"question": str, "answer": str | int}``; ``answer`` must be an integer. Without
    ``options["row"]``, ``reset`` draws a problem with :attr:`np_random` (so the env is seeded).

    **reset** returns ``[system (SYSTEM_PROMPT), user (row["question"])]``.

    A :class:`~agentrl.envs.tool_env.ToolEnv` with the ReTool format, one :class:`PythonTool`
    (no session: every ``<code>`` block runs in a fresh interpreter) and no limit on tool calls
    beyond ``max_turns``.

    **step(action)**:

    - the action holds ``<code>...</code>`` blocks (see :class:`~agentrl.envs.parsers.ReToolParser`):
      each block's code (through :func:`prepare_code`) runs in the sandbox with ``timeout_s`` and
      ``memory_mb``; returns ``[{"role": "tool", "content": "<interpreter>\\n...\\n</interpreter>"}]``
      holding stdout, or on failure stdout plus the tail of stderr / the reason; reward 0.0,
      not terminated; status ``"ok"``;
    - the action holds a ``<code>`` that is never closed (or an empty block): policy *feedback* —
      the tool message holds the :class:`~agentrl.errors.ToolCallError` message, the tool error is
      counted, the episode goes on; status ``"malformed"``;
    - no ``<code>``: the final answer. ``terminated=True``, ``[]``, reward 1.0 if the last
      ``\\boxed{}`` is the answer as an integer (spaces and commas ignored), else 0.0; status
      ``"ok"``; ``info["boxed"]`` is the boxed text (None if there is none).
    - after ``max_turns`` actions without a final answer: ``truncated=True``, status
      ``"truncated"`` (the last tool message is still returned).
    - the sandbox fails (:class:`~agentrl.errors.InfraError`, e.g. SandboxError, or no result
      within ``2 * timeout_s + deadline_grace_s`` s): ``[]``, reward 0.0 (meaningless), ``truncated=True``,
      ``info["infra_failure"] = True``, status ``"infra_failure"``, ``info["error"]`` says why.

    Args:
        sandbox: where code runs. A :class:`~agentrl.sandbox.base.Sandbox` is used as is and
            never closed here (its owner closes it). A kind (``"bubblewrap"``, ``"unsafe-local"``)
            or None (= ``"bubblewrap"``) makes the env create its own sandbox at the first code
            call and close it in :meth:`aclose`.
        max_turns: actions per episode before truncation.
        timeout_s: wall-clock limit of one code execution, seconds; None = the sandbox's own default.
        memory_mb: memory limit of one code execution, MiB; None = the sandbox's own default.
    """

    required_fields = ("question", "answer")
    tool_format = "retool"
    system_prompt = SYSTEM_PROMPT

    def __init__(
        self,
        sandbox: Sandbox | str | None = None,
        max_turns: int = 3,
        timeout_s: float | None = None,
        memory_mb: int | None = None,
    ) -> None:
        super().__init__(
            tools=[PythonTool(session=False, display=False, prepare=prepare_code)],
            sandbox=sandbox,
            max_turns=max_turns,
            max_tool_calls=None,
            max_output_chars=MAX_OUTPUT_CHARS,
            malformed="feedback",
            timeout_s=timeout_s,
            memory_mb=memory_mb,
        )

    def sample_row(self) -> dict[str, Any]:
        """A fresh problem drawn with :attr:`np_random`."""
        return generate_problems(1, int(self.np_random.integers(2**31)))[0]

    def initial_messages(self, row: dict[str, Any]) -> list[Message]:
        if as_int(str(row["answer"])) is None:
            raise DataError(f"CalcEnv: the row's answer {row['answer']!r} is not an integer")
        return [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": str(row["question"])},
        ]

    def truncate_output(self, text: str) -> str:
        """Keep the last ``MAX_OUTPUT_CHARS`` characters (a result is printed last)."""
        return _tail(text, self.max_output_chars)

    async def score(self, action: str) -> tuple[float, dict[str, Any]]:
        """1.0 if the last ``\\boxed{}`` is the answer as an integer, else 0.0; ``info["boxed"]``."""
        assert self.row is not None
        boxed = extract_boxed(action)
        answer = as_int(str(self.row["answer"]))
        return (1.0 if boxed is not None and as_int(boxed) == answer else 0.0), {"boxed": boxed}
