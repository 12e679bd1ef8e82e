"""Agent episodes: rewards, statuses and failures of user agent programs, through the rollout worker
and the real ``openai`` SDK (scripted generator; the real-model run is in tests/e2e/test_agent_e2e.py)."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from agentrl.agents import MODEL, AgentResult, load_agent
from agentrl.config import load_recipe
from agentrl.engine.episodes.agent_episode import play_agent_episode, reward_of
from agentrl.engine.loop.batching import BatchSettings, batch_samples
from agentrl.engine.episodes.gateway import Gateway
from agentrl.engine.episodes.rollout import RolloutWorker
from agentrl.engine.episodes.runner import EpisodeSettings
from agentrl.engine.testing import ScriptedGenerator
from agentrl.envs.calc import sample_texts
from agentrl.errors import AgentError, ConfigError
from agentrl.models.tokenizer import train_tokenizer

ROW = {"question": "Compute 2+3.", "answer": "5"}
CALL = '<tool_call>\n{"name": "python", "arguments": {"code": "print(2+3)"}}\n</tool_call>'


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok")
    train_tokenizer(sample_texts(200, 0), vocab_size=400).save_pretrained(path)
    return str(path)


def solver(prompt: str, params: dict) -> str:
    """A model that calls the tool, then copies the tool's output into \\boxed{}."""
    if "<|im_start|>tool\n" in prompt:
        out = prompt.rsplit("<|im_start|>tool\n", 1)[1].split("<|im_end|>")[0]
        return f"\\boxed{{{out}}}"
    return CALL


def test_the_calc_agent_plays_a_group_through_the_worker_with_its_tool_in_the_sandbox(tok_dir):
    from transformers import AutoTokenizer

    gen = ScriptedGenerator(AutoTokenizer.from_pretrained(tok_dir), solver)
    worker = RolloutWorker(
        episodes=EpisodeSettings(
            tokenizer=tok_dir, env_id="unused", env_kwargs={}, sandbox_kind="unsafe-local", sandbox_kwargs={},
            sampling={"temperature": 1.0, "top_p": 1.0, "stop": ["</code>"]}, max_new_tokens=64, max_episode_tokens=512,
            seed=3, agent="agentrl.envs.calc_agent:calc_agent",
        ),
        generators=[gen], max_concurrent_episodes=8, generate_timeout_s=30)

    async def main():
        try:
            return await worker.run_group(ROW, 7, "p7", 4)
        finally:
            await worker.shutdown()

    group = asyncio.run(main())
    assert [t.status for t in group] == ["ok"] * 4 and [t.reward for t in group] == [1.0] * 4
    assert all(t.metrics["tool_calls"] == 1 and t.metrics["turns"] == 2 for t in group)
    assert "\\boxed{5}" in group[0].info["text"]  # the sandbox printed 5 and the model copied it
    # the recipe's env stop strings do not apply to agents; every call of every sample has its own seed
    assert all("stop" not in params for _, params, _ in gen.calls)
    assert len({params["seed"] for _, params, _ in gen.calls}) == len(gen.calls) == 8
    assert all(v == 0 for t in group for v, m in zip(t.versions, t.loss_mask) if m)
    samples, stats = batch_samples([group], BatchSettings())
    assert len(samples) == 4 and stats["agent_failures_batch"] == 0


def play(tok, agent, script=lambda p, s: "\\boxed{5}", **kw):
    gen = ScriptedGenerator(tok, script)

    async def main():
        gw = Gateway(tok)
        await gw.start()
        async with httpx.AsyncClient() as http:
            try:
                return await play_agent_episode(
                    agent, gw, gen.generate, http_client=http, row=ROW, group_id="g", prompt_index=0, sample_index=kw.pop("sample_index", 0),
                    defaults={"temperature": 1.0}, max_new_tokens=32, max_episode_tokens=kw.pop("max_episode_tokens", 256),
                    max_calls=4, timeout_s=kw.pop("timeout_s", 30.0), **kw)
            finally:
                await gw.aclose()

    return asyncio.run(main())


@pytest.fixture(scope="module")
def tok(tok_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tok_dir)


async def ask(client):
    r = await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Compute 2+3."}])
    return r.choices[0].message.content


def test_an_agent_that_raises_is_an_agent_failure_with_its_traceback_never_a_zero_reward(tok):
    async def agent(client, row):
        await ask(client)
        raise ValueError("boom in the agent")

    t = play(tok, agent)
    assert t.status == "agent_failure" and not t.trainable
    assert "ValueError: boom in the agent" in t.info["error"] and "Traceback" in t.info["error"]
    assert t.num_generated > 0 and t.info["text"]  # what the model wrote is kept for reading
    samples, stats = batch_samples([[t]], BatchSettings())
    assert samples == [] and stats["agent_failures_batch"] == 1 and stats["infra_failures_batch"] == 0


def test_an_agent_that_never_returns_times_out(tok):
    async def agent(client, row):
        await ask(client)
        await asyncio.sleep(3600)

    t = play(tok, agent, timeout_s=0.5)
    assert t.status == "agent_failure" and "did not return within 0.5 s" in t.info["error"]


@pytest.mark.parametrize("result", ["1.0", None, float("nan"), {"score": 1}])
def test_an_agent_that_returns_no_usable_reward_is_an_agent_failure(tok, result):
    async def agent(client, row):
        await ask(client)
        return result

    t = play(tok, agent)
    assert t.status == "agent_failure" and ("expected a float reward" in t.info["error"] or "not finite" in t.info["error"])


def test_rewards_with_details_and_the_row_reach_the_agent(tok):
    seen = {}

    async def agent(client, row):
        seen.update(row)
        row["question"] = "mutated"  # the agent gets a copy
        answer = await ask(client)
        return AgentResult(reward=0.5, info={"answer": answer, "obj": object()})

    t = play(tok, agent)
    assert seen == ROW and ROW["question"] == "Compute 2+3."
    assert t.status == "ok" and t.reward == 0.5 and t.info["agent"]["answer"] == "\\boxed{5}"
    json.dumps(t.info)  # details are made JSON-safe
    assert reward_of({"reward": 2, "x": 1}) == (2.0, {"x": 1}) and reward_of(1) == (1.0, {})
    with pytest.raises(AgentError):
        reward_of(True)


def test_an_agent_stopped_by_the_context_limit_is_an_overflow_episode_trained_with_reward_zero(tok):
    async def agent(client, row):
        messages = [{"role": "user", "content": "Compute 2+3."}]
        while True:  # the conversation grows until the gateway refuses it
            r = await client.chat.completions.create(model=MODEL, messages=messages)
            messages += [r.choices[0].message, {"role": "user", "content": "again " * 10}]

    t = play(tok, agent, max_episode_tokens=120)
    assert t.status == "overflow" and t.trainable and t.reward == 0.0
    assert "rollout.max_episode_tokens" in t.info["error"]


def test_an_agent_that_never_calls_the_model_has_nothing_to_train(tok):
    async def agent(client, row):
        return 1.0

    t = play(tok, agent)
    assert t.status == "agent_failure" and "no model reply" in t.info["error"]


def test_load_agent_names_what_is_wrong():
    with pytest.raises(ConfigError, match="expected 'module:function'"):
        load_agent("no_colon")
    with pytest.raises(ConfigError, match="cannot import"):
        load_agent("agentrl.nowhere:agent")
    with pytest.raises(ConfigError, match="has no attribute"):
        load_agent("agentrl.envs.calc_agent:missing")
    with pytest.raises(ConfigError, match="async def"):
        load_agent("agentrl.envs.calc_agent:score")
    assert load_agent("agentrl.envs.calc_agent:calc_agent").__name__ == "calc_agent"


def test_the_recipe_names_a_bad_agent_spec(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text('[env]\nagent = "just_a_module"\n')
    with pytest.raises(ConfigError, match="module:function"):
        load_recipe(path)
    path.write_text('[env]\nagent = "m:f"\nkwargs = { max_turns = 3 }\n')
    with pytest.raises(ConfigError, match="kwargs are for environments"):
        load_recipe(path)
