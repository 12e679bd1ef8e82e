"""One environment episode as a plain coroutine, token in/token out.

:func:`play_episode` runs over two seams: a ``generate`` coroutine (prompt ids + sampling ->
:class:`~agentrl.engine.common.interfaces.Generation`) and a ``TextEnv``. The other episode kind,
an agent program through the gateway, is :mod:`agentrl.engine.episodes.agent_episode`; the
rollout worker (:mod:`agentrl.engine.episodes.rollout`) plays both through its
:class:`~agentrl.engine.episodes.runner.EpisodeRunner`.
"""

from __future__ import annotations

import time
import zlib
from typing import Any

import anyio

from agentrl.engine.common.episode_text import version_spans
from agentrl.engine.common.interfaces import GenerateFn
from agentrl.engine.common.trajectory import Trajectory
from agentrl.engine.episodes.render import IncrementalRenderer, TemplateMismatch
from agentrl.engine.episodes.stops import with_stop_token_ids
from agentrl.errors import AgentRLError, InfraError

__all__ = ["episode_seed", "play_episode"]


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
    generate_s = env_s = 0.0  # awaiting the generator, awaiting the environment (its tools, the sandbox)

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
            t_gen = time.monotonic()
            gen = await generate(list(tokens), params)
            generate_s += time.monotonic() - t_gen
            turns += 1
            extend(gen.token_ids, 1, gen.logprobs, gen.versions)
            text = tokenizer.decode(gen.token_ids, skip_special_tokens=False)
            action = renderer.strip_special_suffix(text)
            t_env = time.monotonic()
            obs, r, terminated, truncated, step_info = await _env_step(env, action)
            env_s += time.monotonic() - t_env
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
            "generate_s": generate_s,
            "env_s": env_s,
        },
        info=info,
    )
