"""The agent gateway: an OpenAI-compatible Chat Completions endpoint on 127.0.0.1 in front of the
generators, recording every call token-exactly.

One :class:`Gateway` serves all the episodes of a rollout worker. Each episode is opened with a
:class:`Session` (its generate function, limits and recorder) and gets its own base URL,
``http://127.0.0.1:<port>/e/<episode>/v1``; requests carry the gateway's random key as their
bearer token. A request becomes a generation call on the episode's generator (the one its group is
pinned to): its messages are matched against the episode's earlier calls
(:mod:`agentrl.engine.episodes.chat_segments`), ``tools`` are rendered by the chat template, and tool calls
in the output (Hermes/Qwen ``<tool_call>`` JSON) come back as ``tool_calls``.

Answers, as the OpenAI API gives them (the SDK raises the matching exception):

- 400 ``invalid_request_error``: malformed or unsupported request (``BadRequestError``); also
  ``context_length_exceeded`` when the prompt leaves no room under the episode's token limit, and
  ``episode_call_limit`` past the episode's call limit (the episode then ends as ``overflow`` /
  ``truncated`` rather than as an agent failure);
- 401: wrong key; 404: unknown model name, or an episode id that was never opened (or was closed
  longer ago than the gateway remembers: :data:`CLOSED_MEMORY` ids) (``NotFoundError``); 409
  ``episode_closed``: the episode was closed, or the gateway is shutting down (``ConflictError``);
- 503 ``server_error``: the generator failed (the episode becomes an infrastructure failure).

It runs on the asyncio loop of its owner (a Ray actor's loop): agents must use the async client.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import secrets
import socket
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentrl.engine.episodes.chat_api import (
    ChatRequest,
    completion_body,
    error_body,
    parse_request,
    tool_call_message,
)
from agentrl.engine.episodes.chat_segments import ChatRecorder, Reply
from agentrl.engine.common.interfaces import GenerateFn, Generation
from agentrl.engine.episodes.render import special_tokens, strip_special_suffix
from agentrl.engine.episodes.stops import with_stop_token_ids
from agentrl.errors import AgentRLError, InfraError, RequestError

__all__ = ["CLOSED_MEMORY", "Gateway", "Session", "new_http_client"]

CLOSED_MEMORY = 65536
"""How many closed episode ids a gateway remembers (to answer them 409 rather than 404): a bounded
memory, the oldest forgotten first, so that a long run does not grow it forever (~100 bytes each)."""


@dataclass
class Session:
    """One episode's state at the gateway."""

    recorder: ChatRecorder
    """The episode's calls, token-exact."""
    generate: GenerateFn
    """Generation on the episode's generator (prompt ids, ``SamplingParams`` arguments)."""
    defaults: dict[str, Any]
    """Sampling arguments used where a request sets none (the recipe's temperature and top_p)."""
    max_new_tokens: int
    """Tokens per call when the request sets no ``max_tokens``."""
    max_context_tokens: int
    """Most tokens one call may see and write (prompt + output): ``rollout.max_episode_tokens``."""
    max_calls: int
    """Most calls in the episode."""
    forced: dict[str, Any] = field(default_factory=dict)
    """Sampling arguments that override the request's (e.g. an evaluation's temperature)."""
    seed_of: Callable[[int, int], int] | None = None
    """``seed_of(call, choice)``: the sampling seed of a call whose request sets none (None: unseeded)."""
    reference_temperature: float | None = None
    """The temperature the learner assumes; calls sampled at another one are counted."""
    calls: int = 0
    limit: str | None = None
    """``"overflow"`` or ``"truncated"`` once a call was refused for the episode's limits."""
    infra_error: str | None = None
    """Why a generation failed, if one did."""
    temperature_mismatches: int = 0
    tool_calls: int = 0
    """Tool calls the model made (in the first choice of each call)."""
    closed: bool = False


def new_http_client() -> Any:
    """The connection pool the episodes' OpenAI clients share (``http_client=``): openai's
    aiohttp-backed client (httpx-aiohttp). httpx's own pool checks every pooled connection on each
    request, which costs milliseconds per call with one connection per episode in flight."""
    import openai

    return openai.DefaultAioHttpClient(timeout=None)


class Gateway:
    """The HTTP server (aiohttp) and the open episodes.

    Args:
        tokenizer: the policy's tokenizer (its chat template renders the requests).
        model_name: the one model name served (others get a 404).
        tool_parser: parses tool calls out of the output (default Hermes/Qwen ``<tool_call>``).
        closed_memory: how many closed episode ids are remembered (:data:`CLOSED_MEMORY`).
    """

    def __init__(self, tokenizer: Any, *, model_name: str = "policy", tool_parser: Any = None,
                 closed_memory: int = CLOSED_MEMORY) -> None:
        from agentrl.envs.parsers import get_parser

        self.tokenizer = tokenizer
        self.model_name = model_name
        self.parser = tool_parser or get_parser("hermes")
        self.api_key = secrets.token_urlsafe(24)
        """The bearer key every request must carry (random per gateway)."""
        self.sessions: dict[str, Session] = {}
        self._closed: OrderedDict[str, None] = OrderedDict()  # the latest closed episode ids, oldest first
        self._closed_memory = closed_memory
        self._ids = itertools.count()
        self._specials = special_tokens(tokenizer)
        self._stop_ids: dict[tuple[str, ...], list[int]] = {}  # stop strings -> their single-token ids
        self._runner: Any = None
        self.port: int | None = None

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Listen on a free port of 127.0.0.1."""
        from aiohttp import web

        if self._runner is not None:
            return
        @web.middleware
        async def guard(request: Any, handler: Any) -> Any:
            return await self._guard(request, handler)

        app = web.Application(middlewares=[guard], client_max_size=64 * 1024 * 1024)
        app.router.add_post("/e/{episode}/v1/chat/completions", self._chat)
        app.router.add_get("/e/{episode}/v1/models", self._models)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        await web.SockSite(runner, sock).start()
        self._runner, self.port = runner, sock.getsockname()[1]

    async def aclose(self) -> None:
        """Stop serving; open episodes are closed."""
        for s in self.sessions.values():
            s.closed = True
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def open(self, session: Session) -> str:
        """Register an episode; its base URL (for ``openai.AsyncOpenAI(base_url=...)``)."""
        if self.port is None:
            raise AgentRLError("the gateway is not started")
        episode = f"{next(self._ids)}-{secrets.token_hex(4)}"
        self.sessions[episode] = session
        return f"http://127.0.0.1:{self.port}/e/{episode}/v1"

    def close(self, base_url: str) -> Session:
        """End the episode at ``base_url``: later requests get a 409 (while the gateway remembers the
        id, see ``closed_memory``; a 404 after that). Returns its session."""
        episode = base_url.rstrip("/").split("/")[-2]
        session = self.sessions.pop(episode)
        session.closed = True
        self._closed[episode] = None
        while len(self._closed) > self._closed_memory:
            self._closed.popitem(last=False)
        return session

    # ------------------------------------------------------------------ HTTP
    @staticmethod
    def _json(status: int, body: dict[str, Any]) -> Any:
        from aiohttp import web

        return web.json_response(body, status=status, dumps=lambda o: json.dumps(o, ensure_ascii=False))

    async def _guard(self, request: Any, handler: Any) -> Any:
        """Every request: the key first, then the handler; routing errors as OpenAI-style JSON."""
        from aiohttp import web

        if request.headers.get("Authorization", "") != f"Bearer {self.api_key}":
            return self._json(401, error_body("invalid API key", kind="invalid_request_error", code="invalid_api_key"))
        try:
            return await handler(request)
        except web.HTTPNotFound:
            return self._json(404, error_body(f"no such endpoint: {request.method} {request.path}", code="not_found"))
        except web.HTTPMethodNotAllowed:
            return self._json(405, error_body(f"method {request.method} not allowed on {request.path}"))

    def _session(self, request: Any) -> Session | Any:
        episode = request.match_info["episode"]
        session = self.sessions.get(episode)
        if session is None and episode not in self._closed:
            return self._json(404, error_body(f"no such episode: {episode!r}", code="episode_not_found"))
        if session is None or session.closed:
            return self._json(409, error_body("the episode is over", code="episode_closed"))
        return session

    async def _models(self, request: Any) -> Any:
        session = self._session(request)
        if not isinstance(session, Session):
            return session
        return self._json(200, {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": 0, "owned_by": "agentrl"}]})

    async def _chat(self, request: Any) -> Any:
        session = self._session(request)
        if not isinstance(session, Session):
            return session
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return self._json(400, error_body(f"the request body is not valid JSON: {exc}"))
        try:
            req = parse_request(body)
        except RequestError as exc:
            return self._json(400, error_body(str(exc), param=exc.param))
        if req.model != self.model_name:
            return self._json(404, error_body(f"the model {req.model!r} does not exist; this gateway serves {self.model_name!r}",
                                              param="model", code="model_not_found"))
        try:
            status, answer = await self.complete(session, req)
        except RequestError as exc:
            return self._json(400, error_body(str(exc), param=exc.param))
        return self._json(status, answer)

    # ------------------------------------------------------------------ a call
    async def complete(self, session: Session, req: ChatRequest) -> tuple[int, dict[str, Any]]:
        """Serve one validated request of ``session``: ``(HTTP status, body)``."""
        session.calls += 1
        call_index = session.calls - 1
        if session.calls > session.max_calls:
            session.limit = session.limit or "truncated"
            return 400, error_body(f"the episode may make at most {session.max_calls} calls", code="episode_call_limit")
        call = session.recorder.begin(req.messages, req.tools)
        room = session.max_context_tokens - len(call.prompt_ids)
        if room <= 0:
            session.recorder.fail(call)
            session.limit = "overflow"
            return 400, error_body(
                f"the prompt is {len(call.prompt_ids)} tokens; an episode call may see and write at most "
                f"{session.max_context_tokens} (rollout.max_episode_tokens)", param="messages", code="context_length_exceeded")
        params = {**session.defaults, **req.sampling, **session.forced}
        params["max_tokens"] = min(req.max_tokens or session.max_new_tokens, room)
        params = with_stop_token_ids(self.tokenizer, params, self._stop_ids)
        if session.reference_temperature is not None and params.get("temperature", 1.0) != session.reference_temperature:
            session.temperature_mismatches += 1

        def choice_params(i: int) -> dict[str, Any]:
            p = dict(params)
            if "seed" in p:
                p["seed"] = (p["seed"] + i) & 0x7FFFFFFF
            elif session.seed_of is not None:
                p["seed"] = session.seed_of(call_index, i)
            return p

        try:
            gens = await asyncio.gather(*(session.generate(list(call.prompt_ids), choice_params(i)) for i in range(req.n)))
        except InfraError as exc:
            session.recorder.fail(call)
            session.infra_error = session.infra_error or f"{type(exc).__name__}: {exc}"
            return 503, error_body(f"generation failed: {exc}", kind="server_error", code="generator_failed")
        replies, choices = [], []
        for gen in gens:
            reply, finish = self._reply(gen, req)
            replies.append(reply)
            choices.append({
                "message": reply.message,
                "finish_reason": finish,
                "tokens": len(gen.token_ids),
                "logprobs": [(self.tokenizer.decode([t], skip_special_tokens=False), lp)
                             for t, lp in zip(gen.token_ids, gen.logprobs)] if req.logprobs else None,
            })
        session.recorder.finish(call, replies)
        session.tool_calls += len(replies[0].message.get("tool_calls", []))
        return 200, completion_body(completion_id=f"chatcmpl-{secrets.token_hex(8)}", model=self.model_name,
                                    choices=choices, prompt_tokens=len(call.prompt_ids))

    def _reply(self, gen: Generation, req: ChatRequest) -> tuple[Reply, str]:
        """The assistant message of one generation and its finish reason."""
        text = self.tokenizer.decode(gen.token_ids, skip_special_tokens=False)
        content = strip_special_suffix(text, self._specials)
        suffix = text[len(content):]
        finish = "length" if gen.finish_reason == "length" else "stop"
        calls = self.parser.parse(content) if req.parse_tools else []  # a stop string may close a call
        if calls and all(c.error is None for c in calls):
            ids = [f"call_{secrets.token_hex(6)}" for _ in calls]
            message = tool_call_message(content[: calls[0].start].strip(), [(c.name, c.arguments) for c in calls], ids)
            finish = "tool_calls"
        else:
            if gen.finish_reason == "stop" and isinstance(gen.stop_reason, str) and content.endswith(gen.stop_reason):
                content = content[: -len(gen.stop_reason)]  # the API leaves stop sequences out
            message = tool_call_message(content, [], [])
        return Reply(message=message, generation=gen, text=text, special_suffix=suffix), finish
