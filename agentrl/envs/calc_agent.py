"""Calc as an OpenAI-SDK agent program: the same arithmetic task as ``agentrl/Calc-v0``, written the
way agent code is written outside agentrl (chat messages, a Python tool through function calling),
for ``recipes/tiny_agent.toml`` and docs/agents.md.

- :func:`calc_agent`: the agent (``[env] agent = "agentrl.envs.calc_agent:calc_agent"``).
- :func:`demonstrations`: imperfect function-calling demonstrations for the SFT warm-up.
- :func:`sample_texts`: whole episodes as ChatML text, for a tiny model's tokenizer.
"""

from __future__ import annotations

import json
import random
from typing import Any

from agentrl.agents import MODEL, PYTHON_TOOL, run_code
from agentrl.envs.calc import as_int, generate_problems
from agentrl.envs.calc_demos import corrupt_digit
from agentrl.envs.parsers import extract_boxed

__all__ = ["SYSTEM_PROMPT", "calc_agent", "demonstrations", "sample_texts", "score"]

SYSTEM_PROMPT = "Compute with the python tool, then give the integer answer in \\boxed{}."
"""The agent's system message (the tool schema is added by the chat template)."""

MAX_CALLS = 3
"""Model calls per episode."""


def score(answer: str | None, row: dict[str, Any]) -> float:
    """1.0 when ``answer`` holds ``\\boxed{n}`` with the row's integer answer, else 0.0."""
    boxed = extract_boxed(answer or "")
    return 1.0 if boxed is not None and as_int(boxed) == int(row["answer"]) else 0.0


async def calc_agent(client: Any, row: dict[str, Any]) -> float:
    """Ask the model, run each Python tool call in the sandbox, return the final answer's score."""
    messages: list[Any] = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": row["question"]}]
    answer = None
    for _ in range(MAX_CALLS):
        reply = await client.chat.completions.create(model=MODEL, messages=messages, tools=[PYTHON_TOOL])
        message = reply.choices[0].message
        messages.append(message)
        answer = message.content
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            try:
                code = json.loads(call.function.arguments).get("code", "")
            except (json.JSONDecodeError, AttributeError):
                code = ""
            output = await run_code(code) if code else "error: the python tool needs {\"code\": \"...\"}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
    return score(answer, row)


def _expr(row: dict[str, str]) -> str:
    return row["question"].removeprefix("Compute ").removesuffix(".")


def demonstrations(n: int, seed: int = 0, *, p_direct: float = 0.25, p_copy_error: float = 0.3) -> list[dict[str, Any]]:
    """``n`` conversations ``{"messages": [...], "tools": [PYTHON_TOOL]}`` solving Calc problems the
    agent's way, imperfect as :func:`agentrl.envs.calc_demos.demonstrations` (some answer without
    the tool, some copy the result wrongly)."""
    rng = random.Random(seed)
    convs = []
    for row in generate_problems(n, seed + 7919):
        value = row["answer"]
        msgs: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": row["question"]}]
        if rng.random() < p_direct:
            msgs.append({"role": "assistant", "content": f"\\boxed{{{corrupt_digit(value, rng)}}}"})
        else:
            copied = corrupt_digit(value, rng) if rng.random() < p_copy_error else value
            call = {"type": "function", "function": {"name": "python", "arguments": {"code": f"print({_expr(row)})"}}}
            msgs += [
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "content": value},
                {"role": "assistant", "content": f"\\boxed{{{copied}}}"},
            ]
        convs.append({"messages": msgs, "tools": [PYTHON_TOOL]})
    return convs


def sample_texts(n: int, seed: int) -> list[str]:
    """``n`` whole episodes as the tiny model's chat template renders them (system turn with the
    tool schema, question, a ``<tool_call>``, the tool's output, a ``\\boxed{}`` answer)."""
    schema = json.dumps(PYTHON_TOOL["function"])
    texts = []
    for row in generate_problems(n, seed):
        call = json.dumps({"name": "python", "arguments": {"code": f"print({_expr(row)})"}})
        texts.append(
            f"<|im_start|>system\n{SYSTEM_PROMPT}\n<tools>\n{schema}\n</tools><|im_end|>\n"
            f"<|im_start|>user\n{row['question']}<|im_end|>\n"
            f"<|im_start|>assistant\n<tool_call>\n{call}\n</tool_call><|im_end|>\n"
            f"<|im_start|>tool\n{row['answer']}<|im_end|>\n"
            f"<|im_start|>assistant\n\\boxed{{{row['answer']}}}<|im_end|>\n"
        )
    return texts
