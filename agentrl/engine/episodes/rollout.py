"""Rollout: play multi-turn episodes against an environment with a generator, token in/token out.

``play_episode`` is one episode as a plain coroutine over two seams: a ``generate`` coroutine
(prompt ids + sampling -> :class:`~agentrl.engine.generation.generator.Generation`) and a ``TextEnv``.
``RolloutWorker`` runs many episodes at once (an anyio task group per group of samples) and
is wrapped as a Ray actor by the controller. Given an ``agent`` instead of an environment, it
plays agent episodes (:mod:`agentrl.engine.episodes.agent_episode`) through its gateway.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from agentrl.engine.common.audit import AuditLog
from agentrl.engine.common.episode_text import version_spans
from agentrl.engine.common.interfaces import Generation
from agentrl.engine.common.sampling import Sampling
from agentrl.engine.episodes.render import IncrementalRenderer, TemplateMismatch
from agentrl.engine.episodes.stops import with_stop_token_ids
from agentrl.engine.common.trajectory import Trajectory
from agentrl.errors import AgentRLError, InfraError

GenerateFn = Callable[[list[int], dict[str, Any]], Awaitable[Generation]]

__all__ = ["play_episode", "RolloutWorker", "episode_seed", "GenerateFn"]


def episode_seed(seed: int, prompt_index: int, sample_index: int, turn: int) -> int:
    """A deterministic 31-bit sampling seed for one turn of one episode."""
    return zlib.crc32(f"{seed}:{prompt_index}:{sample_index}:{turn}".encode()) & 0x7FFFFFFF


async def _env_step(env: Any, action: str) -> tuple[list[dict], float, bool, bool, dict]:
    """``astep`` when the env offers it, else ``step`` in a worker thread (off the event loop)."""
    base = env.unwrapped
    if hasattr(base, "astep"):
        return await base.astep(action)
    return await anyio.to_thread.run_sync(base.step, action)


async def play_episode(
    env: Any,
    tokenizer: Any,
    generate: GenerateFn,
    *,
    row: dict[str, Any],
    group_id: str,
    prompt_index: int,
    sample_index: int,
    seed: int,
    sampling: dict[str, Any],
    max_new_tokens: int,
    max_episode_tokens: int,
    max_turns: int = 64,
    single_token_stops: bool = True,
    seed_sampling: bool = True,
    keep_messages: bool = False,
) -> Trajectory:
    """Play one episode and return its trajectory.

    ``sampling`` holds ``SamplingParams`` arguments shared by all turns (temperature, stop...);
    ``max_tokens`` is set per turn, and with ``seed_sampling`` a ``seed`` per turn
    (:func:`episode_seed`: reproducible episodes; vLLM then samples those requests on its slower
    per-request path); stop strings that are single tokens are also
    passed as stop token ids (:mod:`agentrl.engine.episodes.stops`; ``single_token_stops=False`` leaves
    them to vLLM's front end alone, for benchmarks that compare the two). The episode ends when the environment
    terminates or truncates it, when the token budget is spent (status ``overflow``) or when the
    infrastructure fails (status ``infra_failure``; what was generated is kept for inspection
    but never trained). ``keep_messages``: leave the conversation in ``info["messages"]`` (the
    prompt's messages, each model turn as an assistant message, each message the environment
    answered with), for reward functions that ask for it.
    """
    t0 = time.monotonic()
    if single_token_stops:
        sampling = with_stop_token_ids(tokenizer, sampling)
    base = env.unwrapped
    messages, _ = base.reset(seed=seed, options={"row": row})
    renderer = IncrementalRenderer(tokenizer, messages)
    conversation = [dict(m) for m in messages] if keep_messages else None
    tokens = renderer.prompt_ids()
    mask = [0] * len(tokens)
    lps = [0.0] * len(tokens)
    vers = [-1] * len(tokens)
    reward = 0.0
    status = "truncated"
    info: dict[str, Any] = {}
    turns = 0
    tool_calls = tool_errors = 0

    def extend(ids: list[int], m: int, lp: list[float] | None = None, v: list[int] | None = None) -> None:
        tokens.extend(ids)
        mask.extend([m] * len(ids))
        lps.extend(lp if lp is not None else [0.0] * len(ids))
        vers.extend(v if v is not None else [-1] * len(ids))

    try:
        while turns < max_turns:
            budget = min(max_new_tokens, max_episode_tokens - len(tokens))
            if budget <= 0:
                status = "overflow"
                break
            params = dict(sampling, max_tokens=budget)
            if seed_sampling:
                params["seed"] = episode_seed(seed, prompt_index, sample_index, turns)
            gen = await generate(list(tokens), params)
            turns += 1
            extend(gen.token_ids, 1, gen.logprobs, gen.versions)
            text = tokenizer.decode(gen.token_ids, skip_special_tokens=False)
            action = renderer.strip_special_suffix(text)
            obs, r, terminated, truncated, step_info = await _env_step(env, action)
            reward += float(r)
            if conversation is not None:
                conversation += [{"role": "assistant", "content": action}, *(dict(m) for m in obs or [])]
            tool_calls = int(step_info.get("tool_calls", tool_calls))
            tool_errors = int(step_info.get("tool_errors", tool_errors))
            if step_info.get("infra_failure"):
                status = "infra_failure"
                info["error"] = step_info.get("error", "environment reported an infrastructure failure")
                break
            if terminated or truncated:
                status = step_info.get("status") or ("ok" if terminated else "truncated")
                break
            try:
                glue = renderer.append_turn(text, obs)
            except TemplateMismatch as exc:
                status, info["error"] = "truncated", str(exc)
                break
            if len(tokens) + len(glue) >= max_episode_tokens:
                status = "overflow"
                break
            extend(glue, 0)
    except InfraError as exc:
        status, info["error"] = "infra_failure", f"{type(exc).__name__}: {exc}"
    except AgentRLError as exc:
        status, info["error"] = "infra_failure", f"{type(exc).__name__}: {exc}"
    if sample_index == 0 or status == "infra_failure":  # one readable episode per group (and failures), for samples.jsonl
        info["text"] = tokenizer.decode(tokens, skip_special_tokens=False)
        info["spans"] = version_spans(tokenizer, tokens, mask, vers)
    if conversation is not None:
        info["messages"] = conversation
    return Trajectory(
        tokens=tokens,
        loss_mask=mask,
        behaviour_logprobs=lps,
        versions=vers,
        reward=reward,
        group_id=group_id,
        sample_index=sample_index,
        prompt_index=prompt_index,
        status=status,
        metrics={
            "turns": float(turns),
            "tool_calls": float(tool_calls),
            "tool_errors": float(tool_errors),
            "generated_tokens": float(sum(mask)),
            "latency_s": time.monotonic() - t0,
        },
        info=info,
    )


class RolloutWorker:
    """Plays groups of episodes concurrently against one environment type.

    ``generators`` are objects with an async ``generate(prompt_ids, sampling)`` method or Ray
    actor handles of :class:`~agentrl.engine.common.interfaces.Generator` (a vLLM or HTTP generator). Routing: a group goes to the
    generator with the fewest outstanding tokens from this worker when it starts, and all its
    samples and turns stay there (they share the prompt, so prefix caching pays off).
    """

    def __init__(
        self,
        *,
        model: str,
        env_id: str,
        env_kwargs: dict[str, Any],
        sandbox_kind: str | None,
        sandbox_kwargs: dict[str, Any],
        generators: list[Any],
        sampling: Sampling | dict[str, Any],
        max_new_tokens: int,
        max_episode_tokens: int,
        max_concurrent_episodes: int,
        generate_timeout_s: float,
        seed: int,
        audit_path: str | None = None,
        seed_sampling: bool = True,
        agent: str | None = None,
        agent_model: str = "policy",
        agent_max_calls: int = 32,
        agent_timeout_s: float = 600.0,
        reward: Any = None,
        judge: Any = None,
        judge_tokenizer: str | None = None,
        judge_generators: list[Any] | None = None,
        reward_model: Any = None,
    ) -> None:
        """``sampling``: how every turn samples, the run's
        :class:`~agentrl.engine.common.sampling.Sampling` (or its vLLM ``SamplingParams``
        arguments as a dict). ``audit_path``: append one record per finished episode to this append-only file (see
        :mod:`agentrl.engine.common.audit`); None writes none. ``seed_sampling``: seed every turn's
        sampling (see :func:`play_episode`). ``agent``: ``"module:function"`` of an agent program
        to play instead of the environment ``env_id``, served under the model name
        ``agent_model``, with at most ``agent_max_calls`` model calls and ``agent_timeout_s``
        seconds per episode. Model-based rewards (:mod:`agentrl.engine.rewards.scoring`): ``reward``, a
        :class:`~agentrl.engine.rewards.scoring.RewardSettings` (None: the environment's reward alone);
        ``judge``, a :class:`~agentrl.engine.rewards.judge.JudgeSettings` (None: no judge) whose prompts
        are tokenised with ``judge_tokenizer`` (None: the policy's) and sent to
        ``judge_generators`` (None: the policy's own generators); ``reward_model``, a
        :class:`~agentrl.engine.rewards.reward_model.RewardModelServer` handle (None: none)."""
        from agentrl.models.loading import load_tokenizer

        self.tokenizer = load_tokenizer(model)
        self.env_id = env_id
        self.env_kwargs = dict(env_kwargs)
        self.sandbox = None
        if sandbox_kind is not None:
            from agentrl.sandbox import create_sandbox

            self.sandbox = create_sandbox(sandbox_kind, **sandbox_kwargs)
        self.generators = generators
        self.outstanding = [0] * len(generators)
        """Tokens (prompt + max new) of this worker's requests in flight, per generator."""
        self.sampling = sampling.params() if isinstance(sampling, Sampling) else dict(sampling)
        """The vLLM ``SamplingParams`` arguments every turn shares."""
        self.max_new_tokens = max_new_tokens
        self.max_episode_tokens = max_episode_tokens
        self.limiter = anyio.CapacityLimiter(max_concurrent_episodes)
        self.generate_timeout_s = generate_timeout_s
        self.seed = seed
        self.seed_sampling = seed_sampling
        self.audit = AuditLog(audit_path) if audit_path else None
        self.agent = None
        if agent is not None:
            from agentrl.agents import load_agent

            self.agent = load_agent(agent)
        self.agent_model = agent_model
        self.agent_max_calls = agent_max_calls
        self.agent_timeout_s = agent_timeout_s
        self.gateway: Any = None
        self.reward = reward
        self.judge = judge
        self.judge_tokenizer = load_tokenizer(judge_tokenizer) if judge is not None and judge_tokenizer else self.tokenizer
        self.judge_generators = list(judge_generators or [])
        self._judge_next = 0
        self.reward_model = reward_model
        self.reward_functions: list[Any] = []
        """The loaded reward functions of ``reward.functions`` (a ConfigError now names one that does not load)."""
        if reward is not None and reward.functions:
            from agentrl.engine.rewards.functions import RewardFunction

            self.reward_functions = [RewardFunction(f) for f in reward.functions]
        self._http: Any = None
        self._gateway_lock = asyncio.Lock()

    def ping(self) -> bool:
        """True once the worker is constructed (the controller's start-up check)."""
        return True

    def process_id(self) -> int:
        """This worker's process id (the controller's start-up check; what a replacement tears
        down after the process died: e.g. the Docker sandbox containers it labelled)."""
        import os

        return os.getpid()

    def set_generators(self, generators: list[Any]) -> None:
        """Replace the generator handles (after a restart); groups in flight keep theirs."""
        if len(generators) != len(self.generators):
            self.outstanding = [0] * len(generators)
        self.generators = list(generators)

    def set_judge_generators(self, generators: list[Any]) -> None:
        """Replace a separate judge's generator handles (after one was replaced); groups being
        scored keep the judge they were given."""
        self.judge_generators = list(generators)

    def set_reward_model(self, reward_model: Any) -> None:
        """Replace the reward model's handle (after it was replaced); scores in flight keep theirs."""
        self.reward_model = reward_model

    def pick_generator(self) -> int:
        """Index of the generator with the fewest outstanding tokens from this worker (ties: the
        lowest index). A whole group is pinned to the generator picked when it starts."""
        return min(range(len(self.generators)), key=lambda i: (self.outstanding[i], i))

    def _generate_fn(self, gen_index: int) -> GenerateFn:
        gen = self.generators[gen_index]
        remote = hasattr(gen.generate, "remote")

        async def generate(ids: list[int], params: dict[str, Any]) -> Generation:
            from agentrl.errors import GeneratorError

            load = len(ids) + int(params.get("max_tokens", 0))
            self.outstanding[gen_index] += load
            try:
                with anyio.fail_after(self.generate_timeout_s):
                    if remote:
                        return await gen.generate.remote(ids, params)
                    return await gen.generate(ids, params)
            except TimeoutError:
                raise GeneratorError(f"generator {gen_index} did not answer within {self.generate_timeout_s} s") from None
            except AgentRLError:
                raise
            except Exception as exc:  # a dead Ray actor, a lost connection
                raise GeneratorError(f"generator {gen_index} call failed: {type(exc).__name__}: {exc}") from exc
            finally:
                self.outstanding[gen_index] -= load

        return generate

    def _make_env(self) -> Any:
        from agentrl.envs import make_env

        kwargs = dict(self.env_kwargs)
        if self.sandbox is not None:
            kwargs.setdefault("sandbox", self.sandbox)
        return make_env(self.env_id, **kwargs)

    def _scorer(self, generate: GenerateFn) -> Any:
        """The model-based scorer of a group whose episodes ran on ``generate`` (the judge uses
        it when the judge is the policy); None when the recipe has only the environment's reward."""
        if self.reward is None:
            return None
        from agentrl.engine.rewards.judge import LLMJudge
        from agentrl.engine.rewards.scoring import EpisodeScorer

        judge = None
        if self.judge is not None:
            if self.judge_generators:  # a frozen judge group: round robin
                gen = self.judge_generators[self._judge_next % len(self.judge_generators)]
                self._judge_next += 1
                generate = gen.generate.remote if hasattr(gen.generate, "remote") else gen.generate
            judge = LLMJudge(self.judge, self.judge_tokenizer, generate)
        scorer = EpisodeScorer(
            self.reward, tokenizer=self.tokenizer, judge=judge, reward_model=self.reward_model, functions=self.reward_functions
        )
        return scorer if scorer.active else None

    async def run_group(
        self, row: dict[str, Any], prompt_index: int, group_id: str, n: int, sampling: dict[str, Any] | None = None,
        score: bool = True,
    ) -> list[Trajectory]:
        """Play ``n`` episodes of the prompt ``row`` concurrently; return them in sample order.
        ``sampling`` overrides the worker's sampling arguments for this group (e.g. greedy eval);
        ``score``: add the model-based rewards (judge, reward model) to each finished episode
        (evaluation passes False: it reports the environment's reward alone)."""
        results: list[Trajectory | None] = [None] * n
        gen_index = self.pick_generator()
        generate = self._generate_fn(gen_index)
        scorer = self._scorer(generate) if score else None
        keep_messages = scorer is not None and scorer.wants_messages
        params = {**self.sampling, **(sampling or {})}
        # reserve the group's expected load at once, so that groups starting together spread out
        reserve = n * self.max_new_tokens
        self.outstanding[gen_index] += reserve

        if self.agent is not None:
            await self._start_gateway()

        async def one(i: int) -> None:
            async with self.limiter:
                if self.agent is not None:
                    results[i] = await self._agent_episode(
                        generate, row, group_id, prompt_index, i, sampling or {}, keep_messages=keep_messages
                    )
                    if scorer is not None:
                        await scorer.score(results[i], row)
                    if self.audit is not None:
                        self._audit(results[i])
                    return
                env = self._make_env()
                try:
                    results[i] = await play_episode(
                        env,
                        self.tokenizer,
                        generate,
                        row=row,
                        group_id=group_id,
                        prompt_index=prompt_index,
                        sample_index=i,
                        seed=self.seed,
                        sampling=params,
                        max_new_tokens=self.max_new_tokens,
                        max_episode_tokens=self.max_episode_tokens,
                        seed_sampling=self.seed_sampling,
                        keep_messages=keep_messages,
                    )
                finally:
                    await env.unwrapped.aclose()
                if scorer is not None:
                    await scorer.score(results[i], row)
                if self.audit is not None:
                    self._audit(results[i])

        try:
            async with anyio.create_task_group() as tg:
                for i in range(n):
                    tg.start_soon(one, i)
        finally:
            self.outstanding[gen_index] -= reserve
        return [r for r in results if r is not None]

    async def _start_gateway(self) -> None:
        """Start the agent gateway and the HTTP client pool on first use (on this actor's loop)."""
        async with self._gateway_lock:
            if self.gateway is None:
                from agentrl.engine.episodes.gateway import Gateway, new_http_client

                gateway = Gateway(self.tokenizer, model_name=self.agent_model)
                await gateway.start()
                self._http = new_http_client()
                self.gateway = gateway

    async def _agent_episode(
        self, generate: GenerateFn, row: dict[str, Any], group_id: str, prompt_index: int, i: int, forced: dict[str, Any],
        keep_messages: bool = False,
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

    def _audit(self, t: Trajectory | None) -> None:
        if t is None:
            return
        made = [v for v in t.versions if v >= 0]
        self.audit.append({  # type: ignore[union-attr]
            "id": t.sample_id,
            "prompt": t.prompt_index,
            "status": t.status,
            "reward": t.reward,
            "generated": t.num_generated,
            "versions": [min(made), max(made)] if made else None,
        })

    async def shutdown(self) -> None:
        """Close the gateway and the sandbox."""
        if self.gateway is not None:
            await self._http.aclose()
            await self.gateway.aclose()
            self.gateway = None
        if self.sandbox is not None:
            await self.sandbox.aclose()
