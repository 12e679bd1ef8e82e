"""Math environments: ``agentrl/MathTool-v0`` (ReTool-style, a Python interpreter) and
``agentrl/Math-v0`` (the same without tools, the text-only baseline).

An episode of MathTool-v0::

    system     MATH_TOOL_PROMPT + how to write <code>
    user       Solve for x: 7x - 12 = 3x + 5.
    assistant  Let me solve it. <code>from fractions import Fraction
               x = Fraction(5 + 12, 7 - 3)
               x</code>                                     -> step: tool message, reward 0
    tool       <interpreter>\\nFraction(17, 4)\\n</interpreter>
    assistant  So x = 17/4, and the answer is \\boxed{\\frac{17}{4}}.   -> terminated, reward 1.0

The reward comes from math-verify in a process pool (:class:`~agentrl.envs.rewards.MathReward`):
``\\frac{17}{4}``, ``17/4``, ``4.25`` and ``x = 17/4`` are all right for ``"17/4"``. A verifier
timeout or crash ends the episode as an infrastructure failure (never a reward of 0).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentrl.envs.rewards import MathReward, MathVerifier
from agentrl.envs.synthetic import linear_equations, word_problems
from agentrl.envs.tool_env import MalformedPolicy, ToolEnv
from agentrl.envs.tools import PythonTool

if TYPE_CHECKING:
    from agentrl.sandbox.base import Sandbox

__all__ = ["MathToolEnv", "MathEnv", "MATH_TOOL_PROMPT", "MATH_PROMPT"]

MATH_TOOL_PROMPT = (
    "Solve the math problem step by step. You have a Python 3 interpreter: use it to compute and "
    "to check your reasoning. Variables and imports persist from one code block to the next "
    "within a problem, and the value of a last bare expression is printed. When you are done, "
    "give the final answer in \\boxed{}, e.g. \\boxed{\\frac{3}{4}}."
)
"""The task instructions of MathTool-v0 (the ReTool format's tool description follows them)."""

MATH_PROMPT = "Solve the math problem step by step, then give the final answer in \\boxed{}, e.g. \\boxed{\\frac{3}{4}}."
"""The system message of Math-v0."""


def _sample_math_row(env: ToolEnv) -> dict[str, Any]:
    seed = int(env.np_random.integers(2**31))
    make = linear_equations if env.np_random.random() < 0.5 else word_problems
    return make(1, seed)[0]


class MathToolEnv(ToolEnv):
    """``agentrl/MathTool-v0``: a math problem, a Python interpreter in the sandbox, an answer in ``\\boxed{}``.

    A :class:`~agentrl.envs.tool_env.ToolEnv` (see it for steps, limits, ``info`` and the
    malformed-call policy) with the ReTool format (``<code>`` -> ``<interpreter>``) and one
    :class:`~agentrl.envs.tools.PythonTool` named ``python``, whose state persists across the
    episode's code blocks (a sandbox session when the sandbox offers one, else replay: see
    :class:`~agentrl.envs.tools.PythonSession`).

    **Row** — ``{"question": str, "answer": str}``; ``answer`` is anything math-verify parses
    (``"17/4"``, ``"\\\\frac{17}{4}"``, ``"(1, 2]"``, ``"x^2+1"``). Without ``options["row"]``,
    ``reset`` draws a synthetic linear equation or word problem with :attr:`np_random`.

    **Final answer** — an action without ``<code>``: reward :class:`~agentrl.envs.rewards.MathReward`
    of its last ``\\boxed{}``; ``info`` adds ``boxed``, ``correct`` and ``reward_terms``.

    Args:
        sandbox: where code runs (a Sandbox, a kind, or None = its own ``"bubblewrap"``; see ToolEnv).
        max_turns: actions per episode.
        max_tool_calls: code blocks per episode (None: no limit beyond ``max_turns``).
        timeout_s: wall-clock limit of one code block, seconds (None: the sandbox's default).
        memory_mb: memory limit of one code block, MiB (None: the sandbox's default).
        max_output_chars: longest interpreter output shown, characters (head and tail kept).
        session: keep interpreter state across code blocks (False: every block starts fresh).
        malformed: malformed-call policy (``"feedback"``, ``"end"``, ``"penalty"``).
        malformed_penalty: reward per malformed call under ``"penalty"``.
        correct_reward: reward of a right answer.
        incorrect_reward: reward of a wrong or missing answer (ReTool: -1.0).
        format_reward: shaping, added when the final answer has a non-empty ``\\boxed{}``.
        tool_use_reward: shaping, added when at least one code block ran without error.
        verifier_timeout_s: math-verify's time limit per answer, seconds.
        system_prompt: the task instructions (default :data:`MATH_TOOL_PROMPT`).
    """

    required_fields = ("question", "answer")
    tool_format = "retool"
    system_prompt = MATH_TOOL_PROMPT

    def __init__(
        self,
        sandbox: Sandbox | str | None = None,
        max_turns: int = 8,
        max_tool_calls: int | None = 16,
        timeout_s: float | None = None,
        memory_mb: int | None = None,
        max_output_chars: int = 2000,
        session: bool = True,
        malformed: MalformedPolicy = "feedback",
        malformed_penalty: float = 0.1,
        correct_reward: float = 1.0,
        incorrect_reward: float = 0.0,
        format_reward: float = 0.0,
        tool_use_reward: float = 0.0,
        verifier_timeout_s: float = 5.0,
        system_prompt: str | None = None,
    ) -> None:
        super().__init__(
            tools=[PythonTool(session=session)],
            sandbox=sandbox,
            max_turns=max_turns,
            max_tool_calls=max_tool_calls,
            max_output_chars=max_output_chars,
            malformed=malformed,
            malformed_penalty=malformed_penalty,
            timeout_s=timeout_s,
            memory_mb=memory_mb,
            system_prompt=system_prompt,
        )
        self.math_reward = MathReward(
            correct=correct_reward,
            incorrect=incorrect_reward,
            format=format_reward,
            tool_use=tool_use_reward,
            verifier=MathVerifier(timeout_s=verifier_timeout_s),
        )
        """How final answers are scored."""

    def sample_row(self) -> dict[str, Any]:
        """A synthetic linear equation or word problem drawn with :attr:`np_random`."""
        return _sample_math_row(self)

    async def score(self, action: str) -> tuple[float, dict[str, Any]]:
        """:class:`~agentrl.envs.rewards.MathReward` of ``action`` against ``row["answer"]``."""
        assert self.row is not None
        return await self.math_reward(
            action, str(self.row["answer"]), successful_tool_calls=self.tool_calls - self.tool_errors
        )


class MathEnv(ToolEnv):
    """``agentrl/Math-v0``: MathTool-v0 without tools — one turn, the answer in ``\\boxed{}``.

    ``reset`` returns ``[system (MATH_PROMPT), user (question)]``; the single ``step`` is the
    final answer: ``terminated=True``, ``[]``, reward as in MathTool-v0 (``info``: ``boxed``,
    ``correct``, ``reward_terms``), or an infrastructure failure if the verifier fails.

    Args:
        sandbox: accepted and ignored (no code runs here), so that the rollout worker can hand
            every environment its sandbox.
        correct_reward, incorrect_reward, format_reward, verifier_timeout_s, system_prompt:
            as for :class:`MathToolEnv`.
    """

    required_fields = ("question", "answer")
    tool_format = None
    system_prompt = MATH_PROMPT

    def __init__(
        self,
        sandbox: Any = None,
        correct_reward: float = 1.0,
        incorrect_reward: float = 0.0,
        format_reward: float = 0.0,
        verifier_timeout_s: float = 5.0,
        system_prompt: str | None = None,
    ) -> None:
        super().__init__(tools=(), tool_format=None, max_turns=1, system_prompt=system_prompt)
        self.math_reward = MathReward(
            correct=correct_reward,
            incorrect=incorrect_reward,
            format=format_reward,
            verifier=MathVerifier(timeout_s=verifier_timeout_s),
        )
        """How final answers are scored."""

    def sample_row(self) -> dict[str, Any]:
        """A synthetic linear equation or word problem drawn with :attr:`np_random`."""
        return _sample_math_row(self)

    async def score(self, action: str) -> tuple[float, dict[str, Any]]:
        """:class:`~agentrl.envs.rewards.MathReward` of ``action`` against ``row["answer"]``."""
        assert self.row is not None
        return await self.math_reward(action, str(self.row["answer"]))
