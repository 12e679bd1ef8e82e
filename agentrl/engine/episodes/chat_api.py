"""The OpenAI Chat Completions wire format, as far as the gateway speaks it: requests in, responses
and errors out. Pure functions over JSON values (no server, no model).

Honoured request fields: ``model``, ``messages``, ``tools``, ``tool_choice`` (``"auto"``,
``"none"``), ``n``, ``temperature``, ``top_p``, ``max_tokens`` / ``max_completion_tokens``,
``stop``, ``seed``, ``presence_penalty``, ``frequency_penalty``, ``logprobs`` (the sampled token's
log-probability; ``top_logprobs`` only 0). Accepted and ignored (they change nothing here):
``user``, ``metadata``, ``store``, ``parallel_tool_calls``, ``service_tier``, ``stream: false``.
Anything else (streaming, forced tool choice, response formats, images) is refused with a 400
error that names the field, rather than silently served differently.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from agentrl.engine.episodes.chat_segments import normalise_messages
from agentrl.errors import RequestError

__all__ = ["ChatRequest", "parse_request", "error_body", "completion_body", "tool_call_message"]

_IGNORED = frozenset({"user", "metadata", "store", "parallel_tool_calls", "service_tier", "stream"})
_SAMPLING = ("temperature", "top_p", "seed", "presence_penalty", "frequency_penalty")
MAX_CHOICES = 16
"""Most choices (``n``) one call may ask for."""


@dataclass
class ChatRequest:
    """A validated chat completion request."""

    model: str
    messages: list[dict[str, Any]]
    """Template messages (:func:`agentrl.engine.episodes.chat_segments.template_message`)."""
    tools: list[dict[str, Any]] | None
    """OpenAI tool schemas, rendered by the chat template; None: no tools."""
    parse_tools: bool
    """Whether tool calls in the output become ``tool_calls`` (tools given, ``tool_choice`` not none)."""
    n: int
    max_tokens: int | None
    """The caller's limit on new tokens (None: the episode's per-turn limit)."""
    logprobs: bool
    sampling: dict[str, Any] = field(default_factory=dict)
    """``temperature``, ``top_p``, ``stop``, ``seed``, penalties: only those the caller set."""


def _number(body: dict[str, Any], key: str, lo: float, hi: float) -> float | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
        raise RequestError(f"{key} must be a number in [{lo}, {hi}], got {v!r}", key)
    return float(v)


def _int(body: dict[str, Any], key: str, lo: int, hi: int | None = None) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
        limit = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise RequestError(f"{key} must be an integer {limit}, got {v!r}", key)
    return v


def _tools(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    tools = body.get("tools")
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise RequestError("tools must be a list of function tools", "tools")
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise RequestError(f'tools[{i}] must be {{"type": "function", "function": {{"name": ..., "parameters": ...}}}}', f"tools[{i}]")
    return tools or None


def parse_request(body: Any) -> ChatRequest:
    """Validate a request body; RequestError (with the offending ``param``) when it is malformed
    or asks for something the gateway does not serve."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    known = {"model", "messages", "tools", "tool_choice", "n", "max_tokens", "max_completion_tokens", "stop", "logprobs", "top_logprobs", *_SAMPLING}
    for key in body:
        if key not in known and key not in _IGNORED:
            raise RequestError(f"unsupported request argument {key!r}", key)
    if body.get("stream"):
        raise RequestError("streaming is not supported by agentrl's gateway; call without stream=True", "stream")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise RequestError("model must be a non-empty string", "model")
    messages = normalise_messages(body.get("messages"))
    tools = _tools(body)
    choice = body.get("tool_choice")
    if choice not in (None, "auto", "none"):
        raise RequestError(f"tool_choice {choice!r} is not supported (only 'auto' and 'none')", "tool_choice")
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and not (isinstance(stop, list) and all(isinstance(s, str) and s for s in stop)):
        raise RequestError("stop must be a string or a list of non-empty strings", "stop")
    top = _int(body, "top_logprobs", 0, 20)
    if top:
        raise RequestError("top_logprobs > 0 is not supported (the sampled token's log-probability is returned)", "top_logprobs")
    logprobs = body.get("logprobs")
    if logprobs is not None and not isinstance(logprobs, bool):
        raise RequestError("logprobs must be true or false", "logprobs")
    limits = [v for v in (_int(body, "max_tokens", 1), _int(body, "max_completion_tokens", 1)) if v is not None]
    sampling: dict[str, Any] = {}
    for key, lo, hi in (("temperature", 0.0, 2.0), ("top_p", 0.0, 1.0), ("presence_penalty", -2.0, 2.0), ("frequency_penalty", -2.0, 2.0)):
        v = _number(body, key, lo, hi)
        if v is not None:
            sampling[key] = v
    if sampling.get("top_p") == 0.0:
        raise RequestError("top_p must be greater than 0", "top_p")
    seed = _int(body, "seed", 0)
    if seed is not None:
        sampling["seed"] = seed & 0x7FFFFFFF
    if stop:
        sampling["stop"] = list(stop)
    return ChatRequest(
        model=model,
        messages=messages,
        tools=tools,
        parse_tools=bool(tools) and choice != "none",
        n=_int(body, "n", 1, MAX_CHOICES) or 1,
        max_tokens=min(limits) if limits else None,
        logprobs=bool(logprobs),
        sampling=sampling,
    )


def error_body(message: str, *, kind: str = "invalid_request_error", param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """An OpenAI-style error body (the SDK raises it as ``BadRequestError``, ``NotFoundError``...)."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def tool_call_message(content: str, calls: list[tuple[str, dict[str, Any]]], ids: list[str]) -> dict[str, Any]:
    """The assistant message for ``content`` and parsed ``calls`` (name, arguments), in template form."""
    msg: dict[str, Any] = {"role": "assistant", "content": content or None}
    if calls:
        msg["tool_calls"] = [
            {"id": i, "type": "function", "function": {"name": name, "arguments": args}} for i, (name, args) in zip(ids, calls)
        ]
    elif msg["content"] is None:
        msg["content"] = ""
    return msg


def _wire(message: dict[str, Any]) -> dict[str, Any]:
    """A template message as the API sends it (tool-call arguments as JSON strings)."""
    out = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        out["tool_calls"] = [
            {"id": c["id"], "type": "function",
             "function": {"name": c["function"]["name"], "arguments": json.dumps(c["function"]["arguments"], ensure_ascii=False)}}
            for c in message["tool_calls"]
        ]
    return out


def completion_body(
    *, completion_id: str, model: str, choices: list[dict[str, Any]], prompt_tokens: int
) -> dict[str, Any]:
    """A ``chat.completion`` object. Each of ``choices`` holds ``message`` (template form),
    ``finish_reason`` and, when asked for, ``logprobs`` (a list of ``(token, logprob)``)."""
    out = []
    completion_tokens = 0
    for i, c in enumerate(choices):
        completion_tokens += c["tokens"]
        entry: dict[str, Any] = {"index": i, "message": _wire(c["message"]), "finish_reason": c["finish_reason"], "logprobs": None}
        if c.get("logprobs") is not None:
            entry["logprobs"] = {"content": [
                {"token": tok, "logprob": lp, "bytes": list(tok.encode("utf-8")), "top_logprobs": []} for tok, lp in c["logprobs"]
            ], "refusal": None}
        out.append(entry)
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": out,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens},
    }
