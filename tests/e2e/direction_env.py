"""A one-turn environment whose reward the model can learn in a handful of steps (imported by
the rollout workers of ``test_learning_e2e`` and ``test_lora_e2e`` through
``env.id = "tests.e2e.direction_env:DigitFirstEnv"``)."""

from __future__ import annotations

from typing import Any

from agentrl.envs.base import Message, StepResult, TextEnv


def rewarded(text: str) -> bool:
    """The behaviour rewarded: the answer's first character is a digit."""
    return text[:1].isdigit()


class DigitFirstEnv(TextEnv):
    """The question as the only message; one turn; reward 1.0 when the answer starts with a digit
    (:func:`rewarded`), else 0.0. ``sandbox`` is accepted and unused (the engine passes one)."""

    required_fields = ("question",)

    def __init__(self, sandbox: Any = None) -> None:
        super().__init__()

    def initial_messages(self, row: dict[str, Any]) -> list[Message]:
        return [{"role": "user", "content": row["question"]}]

    async def astep(self, action: str) -> StepResult:
        self.start_turn()
        self.done = True
        return [], 1.0 if rewarded(action) else 0.0, True, False, self.make_info("ok")
