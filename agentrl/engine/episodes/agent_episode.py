"""Agent episodes: an OpenAI-SDK agent program played against the policy through the gateway.

The second episode kind beside :func:`agentrl.engine.episodes.env_episode.play_episode` (environment
episodes). Both produce the same :class:`~agentrl.engine.common.trajectory.Trajectory`, so the staleness
queue, advantages, losses and metrics do not know which kind they train. An agent episode is:

1. open a gateway session on the group's generator and give the agent a client for it;
2. ``await agent(client, row)`` under the episode's timeout, with the episode's sandbox reachable
   through :func:`agentrl.agents.run_code`;
3. turn the recorded calls into a trajectory (one segment per independent conversation) with the
   agent's reward.

Statuses: ``ok`` (the agent returned a reward); ``overflow`` / ``truncated`` (the gateway refused a
call for the episode's token or call limit, and the agent gave up: reward as returned, else 0,
trained like an environment episode that ran out of budget); ``agent_failure`` (the agent raised,
timed out, returned no usable reward or never had a reply from the model: kept out of the loss,
with the traceback in ``info["error"]``); ``infra_failure`` (a generation or the sandbox failed).
"""

from __future__ import annotations

import json
import math
import time
import traceback
from typing import Any

import anyio

from agentrl.agents import AgentFn, AgentResult, episode_sandbox
from agentrl.engine.episodes.chat_segments import ChatRecorder, episode_trajectory
from agentrl.engine.common.episode_text import version_spans
from agentrl.engine.common.interfaces import GenerateFn
from agentrl.engine.episodes.gateway import Gateway, Session
from agentrl.engine.common.trajectory import AGENT_FAILURE, Trajectory
from agentrl.errors import AgentError, InfraError

__all__ = ["play_agent_episode", "reward_of"]


def reward_of(result: Any) -> tuple[float, dict[str, Any]]:
    """The reward and details an agent returned: a number, an :class:`AgentResult`, or a dict
    with ``"reward"`` (its other keys are the details). AgentError for anything else."""
    info: dict[str, Any] = {}
    if isinstance(result, AgentResult):
        value, info = result.reward, dict(result.info)
    elif isinstance(result, dict) and "reward" in result:
        value, info = result["reward"], {k: v for k, v in result.items() if k != "reward"}
    else:
        value = result
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise AgentError(f"the agent returned {type(result).__name__}; expected a float reward, an AgentResult or a dict with 'reward'")
    if not math.isfinite(value):
        raise AgentError(f"the agent returned a reward that is not finite ({value})")
    return float(value), json.loads(json.dumps(info, default=repr))


async def play_agent_episode(
    agent: AgentFn,
    gateway: Gateway,
    generate: GenerateFn,
    *,
    http_client: Any,
    row: dict[str, Any],
    group_id: str,
    prompt_index: int,
    sample_index: int,
    defaults: dict[str, Any],
    forced: dict[str, Any] | None = None,
    max_new_tokens: int,
    max_episode_tokens: int,
    max_calls: int,
    timeout_s: float,
    sandbox: Any = None,
    seed_of: Any = None,
    reference_temperature: float | None = None,
    keep_messages: bool = False,
) -> Trajectory:
    """Play one agent episode; see the module docstring.

    ``http_client``: a shared ``httpx.AsyncClient`` for the episode's OpenAI client (connections
    are pooled across episodes). ``defaults`` / ``forced``: sampling arguments used where the
    request sets none / that override the request's. ``max_episode_tokens`` bounds one call's
    prompt plus output, ``max_calls`` the calls of the episode, ``timeout_s`` the whole agent.
    ``seed_of(call, choice)`` seeds calls whose request sets no seed. ``keep_messages``: leave
    the episode's last conversation and the model's reply to it in ``info["messages"]`` (for
    reward functions that ask for it)."""
    import openai

    t0 = time.monotonic()
    session = Session(
        recorder=ChatRecorder(gateway.tokenizer), generate=generate, defaults=dict(defaults), forced=dict(forced or {}),
        max_new_tokens=max_new_tokens, max_context_tokens=max_episode_tokens, max_calls=max_calls, seed_of=seed_of,
        reference_temperature=reference_temperature,
    )
    base_url = gateway.open(session)
    client = openai.AsyncOpenAI(base_url=base_url, api_key=gateway.api_key, max_retries=0, timeout=timeout_s, http_client=http_client)
    status, reward, info = "ok", 0.0, {}
    token = episode_sandbox.set(sandbox)
    try:
        with anyio.fail_after(timeout_s):
            result = await agent(client, dict(row))
        reward, details = reward_of(result)
        if details:
            info["agent"] = details
    except TimeoutError:
        status, info["error"] = AGENT_FAILURE, f"the agent did not return within {timeout_s:g} s ([env] agent_timeout_s)"
    except AgentError as exc:
        status, info["error"] = AGENT_FAILURE, str(exc)
    except InfraError as exc:
        status, info["error"] = "infra_failure", f"{type(exc).__name__}: {exc}"
    except Exception:  # noqa: BLE001 - the agent is user code: any exception is its failure
        status, info["error"] = AGENT_FAILURE, traceback.format_exc(limit=20)
    finally:
        episode_sandbox.reset(token)
        gateway.close(base_url)
    if session.infra_error:
        status, info["error"] = "infra_failure", session.infra_error
    elif status == AGENT_FAILURE and session.limit and "did not return" not in info["error"]:
        status = session.limit  # the agent gave up because the gateway refused a call: the model ran out of room
    trajectory = episode_trajectory(
        session.recorder, reward=reward, group_id=group_id, sample_index=sample_index, prompt_index=prompt_index,
        status=status, info=info,
        metrics={
            "turns": float(session.calls),
            "tool_calls": float(session.tool_calls),
            "tool_errors": 0.0,
            "generated_tokens": 0.0,
            "segments": 0.0,
            "temperature_mismatches": float(session.temperature_mismatches),
            "latency_s": time.monotonic() - t0,
        },
    )
    if not trajectory.tokens and trajectory.trainable:
        trajectory.status = AGENT_FAILURE
        info.setdefault("error", "the episode has no model reply to train on (the agent made no successful call)")
    if keep_messages:
        info["messages"] = session.recorder.last_conversation()
    trajectory.metrics["generated_tokens"] = float(trajectory.num_generated)
    trajectory.metrics["segments"] = float(len(trajectory.segments())) if trajectory.tokens else 0.0
    if sample_index == 0 or not trajectory.trainable:
        info["text"] = session.recorder.text()
        info["spans"] = []
        for k, (a, b) in enumerate(trajectory.segments() if trajectory.tokens else []):
            if k:
                info["spans"].append(["\n\n[new segment: the call did not continue the conversation]\n\n", -1])
            info["spans"] += version_spans(
                session.recorder.tokenizer, trajectory.tokens[a:b], trajectory.loss_mask[a:b], trajectory.versions[a:b]
            )
    return trajectory
