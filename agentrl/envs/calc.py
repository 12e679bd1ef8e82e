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

import anyio

from agentrl.envs.base import Message, Status, StepResult, TextEnv
from agentrl.envs.parsers import extract_boxed, parse_code
from agentrl.errors import DataError, InfraError, SandboxError, ToolCallError

if TYPE_CHECKING:
    from agentrl.sandbox.base import ExecResult, Sandbox

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
        tree = ast.parse(code)
    except SyntaxError:
        return code  # the interpreter reports the error to the model
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Expr):
        return code
    if any(isinstance(node, ast.Name) and node.id == "print" for node in ast.walk(tree)):
        return code
    expr = ast.unparse(tree.body[0].value)
    return f"__value = ({expr})\nif __value is not None:\n    print(repr(__value))\n"


def _tail(text: str, limit: int = MAX_OUTPUT_CHARS) -> str:
    return text if len(text) <= limit else "[... output truncated]\n" + text[-limit:]


def format_interpreter(output: str) -> str:
    """The tool message content for ``output``: ``"<interpreter>\\n{output}\\n</interpreter>"``
    (trailing whitespace of ``output`` removed)."""
    return f"<interpreter>\n{output.rstrip()}\n</interpreter>"


def _describe(result: ExecResult, *, timeout_s: float | None, memory_mb: int | None) -> tuple[str, bool]:
    """``(interpreter text, failed)`` for one execution: its stdout, plus on failure the tail of
    stderr or a one-line reason (timeout, memory, exit status)."""
    out = result.stdout + ("\n[stdout truncated]" if result.stdout_truncated else "")
    if result.timed_out:
        limit = f"{timeout_s:g} s" if timeout_s is not None else "its time limit"
        reason = f"TimeoutError: the code ran longer than {limit} and was stopped"
    elif result.memory_exceeded:
        limit = f"{memory_mb} MB" if memory_mb is not None else "its memory limit"
        reason = f"MemoryError: the code used more than {limit} and was stopped"
    elif result.exit_code != 0:
        reason = result.stderr.rstrip() or f"the code exited with status {result.exit_code}"
    else:
        return _tail(out), False
    return _tail(out.rstrip() + "\n" + reason if out.strip() else reason), True


class CalcEnv(TextEnv):
    """``agentrl/Calc-v0``: a calculator task solved with a sandboxed Python interpreter.

    **Row** — ``{"question": str, "answer": str | int}``; ``answer`` must be an integer. Without
    ``options["row"]``, ``reset`` draws a problem with :attr:`np_random` (so the env is seeded).

    **reset** returns ``[system (SYSTEM_PROMPT), user (row["question"])]``.

    **step(action)**:

    - the action holds a ``<code>...</code>`` block (see :func:`~agentrl.envs.parsers.parse_code`):
      the code (through :func:`prepare_code`) runs in the sandbox with ``timeout_s`` and
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
    deadline_grace_s: float = 30.0
    """A code call that has not returned after ``2 * timeout_s + deadline_grace_s`` seconds (``timeout_s``
    None counts as 30) is an infra failure."""

    def __init__(
        self,
        sandbox: Sandbox | str | None = None,
        max_turns: int = 3,
        timeout_s: float | None = None,
        memory_mb: int | None = None,
    ) -> None:
        super().__init__()
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.sandbox_kind = sandbox if isinstance(sandbox, str) or sandbox is None else None
        self.sandbox = None if self.sandbox_kind else sandbox
        self.own_sandbox: Sandbox | None = None
        self.max_turns = max_turns
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb

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

    async def astep(self, action: str) -> StepResult:
        """One turn; see the class docstring for what is returned."""
        self.start_turn()
        assert self.row is not None
        try:
            code = parse_code(action)
        except ToolCallError as exc:
            self.tool_calls += 1
            self.tool_errors += 1
            return self._tool_reply(format_interpreter(f"ToolCallError: {exc}"), "malformed")
        if code is None:
            self.done = True
            boxed = extract_boxed(action)
            answer = as_int(str(self.row["answer"]))
            reward = 1.0 if boxed is not None and as_int(boxed) == answer else 0.0
            return [], reward, True, False, self.make_info("ok", boxed=boxed)
        self.tool_calls += 1
        try:
            result = await self._run(prepare_code(code))
        except InfraError as exc:
            self.done = True
            return [], 0.0, False, True, self.make_info("infra_failure", error=f"{type(exc).__name__}: {exc}")
        text, failed = _describe(result, timeout_s=self.timeout_s, memory_mb=self.memory_mb)
        self.tool_errors += int(failed)
        return self._tool_reply(format_interpreter(text), "ok")

    def _tool_reply(self, content: str, status: Status) -> StepResult:
        truncated = self.turn >= self.max_turns
        self.done = truncated
        info = self.make_info("truncated" if truncated else status)
        return [{"role": "tool", "content": content}], 0.0, False, truncated, info

    async def _run(self, code: str) -> ExecResult:
        """Run ``code`` in the sandbox; raise InfraError when the sandbox fails or never answers."""
        sandbox = self.sandbox
        if sandbox is None:
            if self.own_sandbox is None:
                try:
                    from agentrl.sandbox import create_sandbox
                except ImportError as exc:
                    raise SandboxError(f"agentrl.sandbox cannot be imported: {exc}") from exc
                self.own_sandbox = create_sandbox(self.sandbox_kind or "bubblewrap")
            sandbox = self.own_sandbox
        deadline = 2 * (self.timeout_s or 30.0) + self.deadline_grace_s
        with anyio.move_on_after(deadline):
            return await sandbox.run(code, timeout_s=self.timeout_s, memory_mb=self.memory_mb)
        raise SandboxError(f"the sandbox returned no result within {deadline:g} s")

    def holds_async_resources(self) -> bool:
        return self.own_sandbox is not None

    async def aclose(self) -> None:
        """Close the sandbox this env created itself (a sandbox passed in is left open)."""
        sandbox, self.own_sandbox = self.own_sandbox, None
        if sandbox is not None:
            await sandbox.aclose()
