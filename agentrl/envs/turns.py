"""``agentrl/Turns-v0``: episodes that last a given number of turns, for measuring multi-turn
throughput (``benchmarks/async_vs_sync.py --set env.id=agentrl/Turns-v0``).

Each row says how many assistant turns its episode takes (``"turns"``). After every turn but
the last, the environment answers with a user message asking for the next one; the last turn
ends the episode. The reward is 1.0 when the last turn contains the row's ``answer`` (a short
token; the synthetic rows use the turn count itself), else 0.0: rule-based, and reachable by a
model that learns to repeat what it was told, but the point of the environment is its shape,
not its task. Rows come from ``load_rows("synthetic:turns")`` (:func:`turn_rows`): turn counts
drawn uniformly from ``min_turns`` to ``max_turns`` (1 to 8 by default), so that the episodes of
one batch are very unequal, as in agentic tasks where some finish at once and others take many
tool calls.
"""

from __future__ import annotations

import random
from typing import Any

from agentrl.envs.base import Message, StepResult, TextEnv
from agentrl.errors import ConfigError, DataError

__all__ = ["TurnsEnv", "turn_rows"]

SYSTEM_PROMPT = "Answer each message briefly. When told it is the last turn, say the number you were given."


def turn_rows(n: int, seed: int, min_turns: int = 1, max_turns: int = 8) -> list[dict[str, Any]]:
    """``n`` rows ``{"question", "answer", "turns"}`` with ``turns`` uniform in
    ``[min_turns, max_turns]``, the same for the same seed."""
    if not 1 <= min_turns <= max_turns:
        raise ConfigError(f"turn_rows: need 1 <= min_turns <= max_turns, got {min_turns}, {max_turns}")
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        k = rng.randint(min_turns, max_turns)
        rows.append({"question": f"We will talk for {k} turn{'s' if k > 1 else ''}. Remember the number {k}.", "answer": str(k), "turns": k})
    return rows


class TurnsEnv(TextEnv):
    """An episode of exactly ``row["turns"]`` assistant turns (see the module docstring).

    Args:
        sandbox: accepted and unused (the engine offers every environment its sandbox).
    """

    required_fields = ("question", "answer", "turns")

    def __init__(self, sandbox: Any = None) -> None:
        super().__init__()

    def sample_row(self) -> dict[str, Any]:
        """A row of 1 to 8 turns drawn with :attr:`np_random`."""
        return turn_rows(1, int(self.np_random.integers(1 << 31)))[0]

    def initial_messages(self, row: dict[str, Any]) -> list[Message]:
        try:
            turns = int(row["turns"])
        except (TypeError, ValueError):
            raise DataError(f"Turns-v0: row field 'turns' must be an integer, got {row['turns']!r}") from None
        if turns < 1:
            raise DataError(f"Turns-v0: row field 'turns' must be at least 1, got {turns}")
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": str(row["question"])}]

    async def astep(self, action: str) -> StepResult:
        assert self.row is not None
        self.turn += 1
        turns = int(self.row["turns"])
        if self.turn >= turns:
            self.done = True
            reward = 1.0 if str(self.row["answer"]) in action else 0.0
            return [], reward, True, False, self.make_info("ok")
        left = turns - self.turn
        prompt = "Last turn: say the number." if left == 1 else f"Go on ({left} turns left)."
        return [{"role": "user", "content": prompt}], 0.0, False, False, self.make_info("ok")
