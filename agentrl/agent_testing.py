"""Testing an agent program offline: no model, no gateway, no Ray.

An agent (:mod:`agentrl.agents`) talks to the policy through an ``openai.AsyncOpenAI`` client and
runs code with :func:`agentrl.agents.run_code`. Here a :class:`ScriptedClient` stands in for the
client: each ``chat.completions.create`` call returns the next scripted reply as the OpenAI SDK's
own ``ChatCompletion`` (so ``reply.choices[0].message.tool_calls[0].function.arguments`` reads as
it does in training), and records what the agent asked. :func:`play_offline` runs one episode
with a sandbox of your choice: a real one (``agentrl.sandbox.make_sandbox``) or a fake from
:mod:`agentrl.sandbox.testing`.

    client = ScriptedClient([tool_call("python", {"code": "print(6*7)"}), "The answer is 42."])
    reward = await play_offline(agent, {"question": "6*7?", "answer": "42"}, client, FakeSandbox())
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from agentrl.agents import AgentFn, episode_sandbox
from agentrl.errors import AgentRLError

__all__ = ["ScriptedClient", "play_offline", "tool_call"]

Reply = str | dict[str, Any]
"""A scripted reply: the assistant's text, or ``{"content": str | None, "tool_calls": [...]}``
whose calls are :func:`tool_call` values."""


def tool_call(name: str, arguments: dict[str, Any], call_id: str | None = None) -> dict[str, Any]:
    """A scripted reply that calls one tool: no text, one call of ``name`` with ``arguments``.
    Put several in one reply with ``{"content": None, "tool_calls": [tool_call(...)["tool_calls"][0], ...]}``."""
    return {"content": None, "tool_calls": [{"id": call_id, "name": name, "arguments": arguments}]}


class _Completions:
    def __init__(self, client: ScriptedClient) -> None:
        self._client = client

    async def create(self, **request: Any) -> Any:
        return self._client._next(request)


class _Chat:
    def __init__(self, client: ScriptedClient) -> None:
        self.completions = _Completions(client)


class ScriptedClient:
    """An ``openai.AsyncOpenAI`` stand-in whose ``chat.completions.create`` returns ``replies`` in
    order (an :class:`~agentrl.errors.AgentRLError` when the agent asks for more than were
    scripted). ``requests``: the keyword arguments of every call, in order (``messages``,
    ``model``, ``tools``...), as the agent sent them."""

    def __init__(self, replies: Sequence[Reply], model: str = "policy") -> None:
        self.replies = list(replies)
        self.model = model
        self.requests: list[dict[str, Any]] = []
        self.chat = _Chat(self)

    def _next(self, request: dict[str, Any]) -> Any:
        from openai.types.chat import ChatCompletion

        self.requests.append({k: list(v) if isinstance(v, list) else v for k, v in request.items()})  # as sent, not as later appended to
        n = len(self.requests)
        if n > len(self.replies):
            raise AgentRLError(f"ScriptedClient: call {n} asked for a reply, but only {len(self.replies)} were scripted")
        reply = self.replies[n - 1]
        spec = {"content": reply} if isinstance(reply, str) else dict(reply)
        calls = [
            {"id": c.get("id") or f"call_{n}_{i}", "type": "function",
             "function": {"name": c["name"], "arguments": json.dumps(c.get("arguments", {}))}}
            for i, c in enumerate(spec.get("tool_calls") or [])
        ]
        message: dict[str, Any] = {"role": "assistant", "content": spec.get("content")}
        if calls:
            message["tool_calls"] = calls
        return ChatCompletion.model_validate({
            "id": f"scripted-{n}", "object": "chat.completion", "created": int(time.time()),
            "model": request.get("model", self.model),
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
        })


async def play_offline(agent: AgentFn, row: dict[str, Any], client: Any, sandbox: Any = None) -> Any:
    """What ``agent(client, row)`` returns, run as an episode would run it: ``sandbox`` is the
    episode's sandbox for :func:`agentrl.agents.run_code` (None: none, as in a recipe without a
    ``[sandbox]``)."""
    token = episode_sandbox.set(sandbox)
    try:
        return await agent(client, row)
    finally:
        episode_sandbox.reset(token)
