"""The episode runner: plays one episode of a rollout worker, an environment episode
(:mod:`agentrl.engine.episodes.env_episode`) or an agent program through the gateway
(:mod:`agentrl.engine.episodes.agent_episode`), and owns what they run on: the environment's
construction, the worker's sandbox, the agent gateway and its HTTP client.

It knows nothing of generators (it is given a ``generate``) nor of scoring. What it plays comes
as :class:`EpisodeSettings`, plain values that :func:`agentrl.engine.wiring.episode_settings`
reads from the recipe; :meth:`EpisodeRunner.from_settings` loads what they name.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from agentrl.engine.common.trajectory import Trajectory
from agentrl.engine.common.interfaces import GenerateFn
from agentrl.engine.common.sampling import Sampling
from agentrl.engine.episodes.env_episode import episode_seed, play_episode

__all__ = ["EpisodeRunner", "EpisodeSettings"]


@dataclass(frozen=True)
class EpisodeSettings:
    """What a rollout worker's episodes are, as plain values (picklable: they travel to the
    worker's Ray actor, which loads what they name with :meth:`EpisodeRunner.from_settings`)."""

    tokenizer: str
    """The policy's tokenizer, a folder or hub id (the worker's scoring bundle shares it)."""
    env_id: str
    """The environment every episode plays (:func:`agentrl.envs.make_env`); unused with ``agent``."""
    env_kwargs: dict[str, Any]
    """Arguments of each episode's environment (the worker's sandbox is added as ``sandbox``
    unless they name one)."""
    sandbox_kind: str | None
    """The worker's sandbox, shared by its episodes (:func:`agentrl.sandbox.create_sandbox`; None: none)."""
    sandbox_kwargs: dict[str, Any]
    """Arguments of that sandbox."""
    sampling: Sampling | dict[str, Any]
    """How every turn samples: the run's :class:`~agentrl.engine.common.sampling.Sampling`, or its
    vLLM ``SamplingParams`` arguments as a dict."""
    max_new_tokens: int
    """New tokens of one turn at most."""
    max_episode_tokens: int
    """Tokens of one episode at most (prompt, turns and tool results)."""
    seed: int
    """The run's seed; with ``seed_sampling`` every turn's sampling seed derives from it
    (:func:`~agentrl.engine.episodes.env_episode.episode_seed`)."""
    seed_sampling: bool = True
    """Seed every turn's sampling (False: vLLM's own randomness)."""
    agent: str | None = None
    """``"module:function"`` of an agent program to play instead of the environment (None: the environment)."""
    agent_model: str = "policy"
    """The model name the agent gateway serves the policy under."""
    agent_max_calls: int = 32
    """Model calls of one agent episode at most."""
    agent_timeout_s: float = 600.0
    """Seconds one agent episode may take."""


class EpisodeRunner:
    """Plays episodes of one environment type (or one agent program).

    ``tokenizer``: the policy's; ``env_id``, ``env_kwargs``: what :func:`agentrl.envs.make_env`
    builds for each episode (the runner's ``sandbox`` is added as ``sandbox`` unless the kwargs
    name one); ``sandbox``: the worker's sandbox (None: none); ``sampling``: the vLLM
    ``SamplingParams`` arguments every turn shares; ``max_new_tokens``, ``max_episode_tokens``:
    the per-turn and per-episode token budgets; ``seed``, ``seed_sampling``: seed every turn's
    sampling (see :func:`~agentrl.engine.episodes.env_episode.play_episode`); ``agent``: a loaded
    agent program to play instead of the environment (None: the environment), served under the
    model name ``agent_model`` with at most ``agent_max_calls`` model calls and
    ``agent_timeout_s`` seconds per episode."""

    def __init__(
        self, *, tokenizer: Any, env_id: str, env_kwargs: dict[str, Any], sandbox: Any, sampling: dict[str, Any],
        max_new_tokens: int, max_episode_tokens: int, seed: int, seed_sampling: bool = True, agent: Any = None,
        agent_model: str = "policy", agent_max_calls: int = 32, agent_timeout_s: float = 600.0,
    ) -> None:
        self.tokenizer = tokenizer
        self.env_id = env_id
        self.env_kwargs = dict(env_kwargs)
        self.sandbox = sandbox
        self.sampling = dict(sampling)
        """The vLLM ``SamplingParams`` arguments every turn shares."""
        self.max_new_tokens = max_new_tokens
        self.max_episode_tokens = max_episode_tokens
        self.seed = seed
        self.seed_sampling = seed_sampling
        self.agent = agent
        self.agent_model = agent_model
        self.agent_max_calls = agent_max_calls
        self.agent_timeout_s = agent_timeout_s
        self.gateway: Any = None
        self._http: Any = None
        self._gateway_lock = asyncio.Lock()

    @classmethod
    def from_settings(cls, settings: EpisodeSettings) -> EpisodeRunner:
        """The runner of ``settings``, with what they name loaded: the tokenizer, the sandbox
        (created, not yet started) and the agent program."""
        from agentrl.models.loading import load_tokenizer

        s = settings
        tokenizer = load_tokenizer(s.tokenizer)
        sandbox = None
        if s.sandbox_kind is not None:
            from agentrl.sandbox import create_sandbox

            sandbox = create_sandbox(s.sandbox_kind, **s.sandbox_kwargs)
        agent = None
        if s.agent is not None:
            from agentrl.agents import load_agent

            agent = load_agent(s.agent)
        return cls(
            tokenizer=tokenizer, env_id=s.env_id, env_kwargs=s.env_kwargs, sandbox=sandbox,
            sampling=s.sampling.params() if isinstance(s.sampling, Sampling) else dict(s.sampling),
            max_new_tokens=s.max_new_tokens, max_episode_tokens=s.max_episode_tokens, seed=s.seed, seed_sampling=s.seed_sampling,
            agent=agent, agent_model=s.agent_model, agent_max_calls=s.agent_max_calls, agent_timeout_s=s.agent_timeout_s,
        )

    async def ready(self) -> None:
        """Start what a group's episodes need before they run: the agent gateway and its HTTP
        client pool on first use (on the caller's event loop); nothing for environment episodes."""
        if self.agent is None:
            return
        async with self._gateway_lock:
            if self.gateway is None:
                from agentrl.engine.episodes.gateway import Gateway, new_http_client

                gateway = Gateway(self.tokenizer, model_name=self.agent_model)
                await gateway.start()
                self._http = new_http_client()
                self.gateway = gateway

    async def play(
        self, generate: GenerateFn, *, row: dict[str, Any], group_id: str, prompt_index: int, sample_index: int,
        sampling: dict[str, Any] | None = None, keep_messages: bool = False,
    ) -> Trajectory:
        """Play sample ``sample_index`` of the prompt ``row`` on ``generate``. ``sampling``
        overrides the shared sampling arguments for this episode (e.g. greedy eval);
        ``keep_messages``: leave the conversation in ``info["messages"]`` (for a reward function
        that asks for it). Call :meth:`ready` first."""
        if self.agent is not None:
            return await self._agent_episode(generate, row, group_id, prompt_index, sample_index, sampling or {}, keep_messages)
        env = self._make_env()
        try:
            return await play_episode(
                env,
                self.tokenizer,
                generate,
                row=row,
                group_id=group_id,
                prompt_index=prompt_index,
                sample_index=sample_index,
                seed=self.seed,
                sampling={**self.sampling, **(sampling or {})},
                max_new_tokens=self.max_new_tokens,
                max_episode_tokens=self.max_episode_tokens,
                seed_sampling=self.seed_sampling,
                keep_messages=keep_messages,
            )
        finally:
            await env.unwrapped.aclose()

    def _make_env(self) -> Any:
        from agentrl.envs import make_env

        kwargs = dict(self.env_kwargs)
        if self.sandbox is not None:
            kwargs.setdefault("sandbox", self.sandbox)
        return make_env(self.env_id, **kwargs)

    async def _agent_episode(
        self, generate: GenerateFn, row: dict[str, Any], group_id: str, prompt_index: int, i: int, forced: dict[str, Any],
        keep_messages: bool,
    ) -> Trajectory:
        from agentrl.engine.episodes.agent_episode import play_agent_episode

        seed_of = (lambda call, choice: episode_seed(self.seed, prompt_index, i, call * 100 + choice)) if self.seed_sampling else None
        return await play_agent_episode(
            self.agent, self.gateway, generate, http_client=self._http, row=row, group_id=group_id,
            prompt_index=prompt_index, sample_index=i,
            defaults={k: v for k, v in self.sampling.items() if k in ("temperature", "top_p")}, forced=forced,
            max_new_tokens=self.max_new_tokens, max_episode_tokens=self.max_episode_tokens,
            max_calls=self.agent_max_calls, timeout_s=self.agent_timeout_s, sandbox=self.sandbox,
            seed_of=seed_of, reference_temperature=self.sampling.get("temperature"), keep_messages=keep_messages,
        )

    async def shutdown(self) -> None:
        """Close the gateway and the sandbox."""
        if self.gateway is not None:
            await self._http.aclose()
            await self.gateway.aclose()
            self.gateway = None
        if self.sandbox is not None:
            await self.sandbox.aclose()
