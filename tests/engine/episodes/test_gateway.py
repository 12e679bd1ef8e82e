"""The agent gateway through the real ``openai`` SDK, against a scripted generator: token-exact
trajectories, segments, tool calls, sampling fields and OpenAI-style errors."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import openai
import pytest

from agentrl.agents import MODEL, PYTHON_TOOL
from agentrl.engine.loop.batching import BatchSettings, batch_samples
from agentrl.engine.episodes.chat_segments import ChatRecorder, episode_trajectory
from agentrl.engine.episodes.gateway import Gateway, Session
from agentrl.engine.testing import ScriptedGenerator
from agentrl.envs.calc import sample_texts
from agentrl.models.tokenizer import train_tokenizer

CALL = '<tool_call>\n{"name": "python", "arguments": {"code": "print(2+3)"}}\n</tool_call>'


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(sample_texts(200, 0), vocab_size=400)


def tool_script(prompt: str, params: dict[str, Any]) -> str:
    return "\\boxed{5}" if "<|im_start|>tool" in prompt else CALL


def run(tok, script, agent, *, tokenize=None, max_context=1024, max_calls=8, generate=None, **session_kw):
    """Serve one episode of ``agent(client)`` on a generator scripted by ``script`` (or on
    ``generate``); (trajectory, generator, session, agent result)."""
    gen = ScriptedGenerator(tok, script, tokenize=tokenize)

    async def main():
        gw = Gateway(tok)
        await gw.start()
        session = Session(recorder=ChatRecorder(tok), generate=generate or gen.generate, defaults={"temperature": 1.0},
                          max_new_tokens=200, max_context_tokens=max_context, max_calls=max_calls, **session_kw)
        url = gw.open(session)
        async with httpx.AsyncClient() as http:
            client = openai.AsyncOpenAI(base_url=url, api_key=gw.api_key, max_retries=0, http_client=http)
            try:
                out = await agent(client)
            finally:
                gw.close(url)
                await gw.aclose()
        traj = episode_trajectory(session.recorder, reward=1.0, group_id="g", sample_index=0, prompt_index=0)
        return traj, gen, session, out

    return asyncio.run(main())


def generated_runs(traj) -> list[list[int]]:
    """The runs of consecutive loss-mask-1 ids."""
    runs, cur = [], []
    for t, m in zip(traj.tokens, traj.loss_mask):
        if m:
            cur.append(t)
        elif cur:
            runs.append(cur)
            cur = []
    return runs + ([cur] if cur else [])


START = [{"role": "system", "content": "Use the tool."}, {"role": "user", "content": "Compute 2+3."}]


async def two_turns(client):
    messages = list(START)
    r1 = await client.chat.completions.create(model=MODEL, messages=messages, tools=[PYTHON_TOOL], logprobs=True)
    msg = r1.choices[0].message
    messages.append(msg)
    messages.append({"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "5"})
    r2 = await client.chat.completions.create(model=MODEL, messages=messages, tools=[PYTHON_TOOL])
    return r1, r2, messages


def test_a_tool_call_comes_back_as_tool_calls_and_the_episode_is_one_exact_sequence(tok):
    traj, gen, session, (r1, r2, messages) = run(tok, tool_script, two_turns)
    c = r1.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    assert c.message.tool_calls[0].function.name == "python"
    assert json.loads(c.message.tool_calls[0].function.arguments) == {"code": "print(2+3)"}
    assert [x.logprob for x in c.logprobs.content] == [-0.5] * len(gen.calls[0][2])
    assert r2.choices[0].message.content == "\\boxed{5}" and r2.choices[0].finish_reason == "stop"
    assert r1.usage.prompt_tokens == len(gen.calls[0][0]) and "<tools>" in tok.decode(gen.calls[0][0])
    # one segment: the second call's prompt is the first call's prompt + its exact ids + glue
    assert traj.segment_starts == () and session.calls == 2
    p1, _, ids1 = gen.calls[0]
    p2, _, ids2 = gen.calls[1]
    assert p2[: len(p1) + len(ids1)] == p1 + ids1
    assert generated_runs(traj) == [ids1, ids2]
    assert traj.tokens == p2 + ids2
    # and here the template agrees with the exact ids: the whole text is the conversation's rendering
    full = messages + [{"role": "assistant", "content": "\\boxed{5}"}]
    full[2] = {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "python", "arguments": {"code": "print(2+3)"}}}]}
    assert tok.decode(traj.tokens, skip_special_tokens=False) == tok.apply_chat_template(full, tools=[PYTHON_TOOL], tokenize=False).removesuffix("\n")


def test_the_ids_the_model_wrote_are_kept_even_where_retokenising_would_change_them(tok):
    def by_char(text: str) -> list[int]:  # a legal but non-canonical tokenisation: one id per character
        return [i for ch in text for i in tok.encode(ch, add_special_tokens=False)]

    traj, gen, _, _ = run(tok, tool_script, two_turns, tokenize=by_char)
    ids1 = gen.calls[0][2]
    assert ids1[:-1] != tok.encode(tok.decode(ids1[:-1]), add_special_tokens=False)  # re-tokenising differs
    assert generated_runs(traj)[0] == ids1  # the trajectory holds what was sampled
    assert gen.calls[1][0][: len(gen.calls[0][0]) + len(ids1)] == gen.calls[0][0] + ids1


def test_rewritten_history_starts_a_segment_each_exactly_what_the_model_saw(tok):
    async def compacting(client):
        r1 = await client.chat.completions.create(model=MODEL, messages=START)
        summary = [{"role": "system", "content": "Summary so far: nothing."}, {"role": "user", "content": "Go on."}]
        await client.chat.completions.create(model=MODEL, messages=summary)
        return r1

    traj, gen, _, _ = run(tok, lambda p, s: "\\boxed{5}", compacting)
    assert len(traj.segments()) == 2
    (a0, a1), (b0, b1) = traj.segments()
    assert traj.tokens[a0:a1] == gen.calls[0][0] + gen.calls[0][2]
    assert traj.tokens[b0:b1] == gen.calls[1][0] + gen.calls[1][2]
    samples, _ = batch_samples([[traj, episode_copy(traj, 0.0)]], BatchSettings())
    assert [s["id"] for s in samples] == ["g/0#0", "g/0#1", "g/1#0", "g/1#1"]
    assert samples[0]["advantage"] == samples[1]["advantage"] > 0 > samples[2]["advantage"] == samples[3]["advantage"]


def episode_copy(traj, reward):
    from dataclasses import replace

    return replace(traj, reward=reward, sample_index=1)


def test_n_choices_and_the_continued_one_is_trained(tok):
    counter = iter(range(100))

    def script(prompt, params):
        return f"answer {next(counter)}"

    async def pick_last(client):
        r = await client.chat.completions.create(model=MODEL, messages=START, n=3, temperature=1.0)
        chosen = r.choices[2].message
        await client.chat.completions.create(model=MODEL, messages=START + [chosen, {"role": "user", "content": "Sure?"}])
        return r

    traj, gen, _, r = run(tok, script, pick_last, seed_of=lambda call, choice: 100 * call + choice)
    assert [c.message.content for c in r.choices] == ["answer 0", "answer 1", "answer 2"]
    assert traj.segment_starts == ()
    assert generated_runs(traj)[0] == gen.calls[2][2]  # the third choice, continued
    assert len({c[1].get("seed") for c in gen.calls[:3]}) == 3  # the choices were sampled with distinct seeds


def test_sampling_fields_are_honoured(tok):
    async def agent(client):
        return await client.chat.completions.create(
            model=MODEL, messages=START, temperature=0.3, top_p=0.9, max_completion_tokens=3, stop=["</x>"], seed=11)

    traj, gen, session, r = run(tok, lambda p, s: "a long answer here", agent, reference_temperature=1.0)
    params = gen.calls[0][1]
    assert params["temperature"] == 0.3 and params["top_p"] == 0.9 and params["max_tokens"] == 3
    assert params["stop"] == ["</x>"] and params["seed"] == 11
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3
    assert session.temperature_mismatches == 1


def test_an_evaluation_can_force_its_temperature(tok):
    async def agent(client):
        await client.chat.completions.create(model=MODEL, messages=START, temperature=0.7)

    _, gen, _, _ = run(tok, lambda p, s: "x", agent, forced={"temperature": 0.0})
    assert gen.calls[0][1]["temperature"] == 0.0


@pytest.mark.parametrize(("kwargs", "param"), [
    ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
    ({"messages": []}, "messages"),
    ({"messages": START, "n": 0}, "n"),
    ({"messages": START, "temperature": 5}, "temperature"),
    ({"messages": START, "tool_choice": "required", "tools": [PYTHON_TOOL]}, "tool_choice"),
    ({"messages": START, "tools": [{"type": "function"}]}, "tools[0]"),
    ({"messages": START, "extra_body": {"guided_json": {}}}, "guided_json"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages[0].content"),
])
def test_malformed_requests_are_bad_request_errors_naming_the_field(tok, kwargs, param):
    async def agent(client):
        extra = kwargs.pop("extra_body", None)
        with pytest.raises(openai.BadRequestError) as info:
            await client.chat.completions.create(model=MODEL, **kwargs, **({"extra_body": extra} if extra else {}))
        return info.value

    _, gen, _, err = run(tok, lambda p, s: "x", agent)
    assert err.status_code == 400 and err.body["param"] == param and gen.calls == []


def test_unknown_model_is_404_and_wrong_key_401(tok):
    async def agent(client):
        with pytest.raises(openai.NotFoundError) as nf:
            await client.chat.completions.create(model="gpt-4o", messages=START)
        bad = client.with_options(api_key="wrong")
        with pytest.raises(openai.AuthenticationError):
            await bad.chat.completions.create(model=MODEL, messages=START)
        models = await client.models.list()
        return nf.value, [m.id for m in models.data]

    _, _, _, (nf, models) = run(tok, lambda p, s: "x", agent)
    assert "gpt-4o" in str(nf) and models == [MODEL]


def test_a_closed_episode_is_409_an_episode_that_never_existed_404_and_closed_ids_are_remembered_boundedly(tok):
    def session():
        return Session(recorder=ChatRecorder(tok), generate=None, defaults={}, max_new_tokens=4, max_context_tokens=64, max_calls=1)

    async def main():
        gw = Gateway(tok, closed_memory=2)
        await gw.start()
        urls = [gw.open(session()) for _ in range(3)]
        live = gw.open(session())
        for url in urls:
            gw.close(url)
        never = live.replace(live.split("/")[-2], "12345-00000000")
        answers = {}
        async with httpx.AsyncClient() as http:
            for name, url in [("oldest", urls[0]), ("closed", urls[1]), ("latest", urls[2]), ("never", never), ("live", live)]:
                client = openai.AsyncOpenAI(base_url=url, api_key=gw.api_key, max_retries=0, http_client=http)
                try:
                    await client.models.list()
                    answers[name] = 200
                except openai.APIStatusError as exc:
                    answers[name] = (exc.status_code, exc.body["code"])
            closed = openai.AsyncOpenAI(base_url=urls[2], api_key=gw.api_key, max_retries=0, http_client=http)
            with pytest.raises(openai.ConflictError, match="the episode is over"):
                await closed.chat.completions.create(model=MODEL, messages=START)
        gw.close(live)
        await gw.aclose()
        return answers, gw

    answers, gw = asyncio.run(main())
    assert answers == {
        "closed": (409, "episode_closed"), "latest": (409, "episode_closed"),  # closed: a conflict, not "no such episode"
        "never": (404, "episode_not_found"),
        "oldest": (404, "episode_not_found"),  # closed longer ago than the gateway remembers (closed_memory=2)
        "live": 200,
    }
    assert gw.sessions == {}  # closed sessions themselves are not kept


def test_a_prompt_over_the_limit_is_context_length_exceeded_and_the_call_limit_is_enforced(tok):
    async def long_prompt(client):
        with pytest.raises(openai.BadRequestError) as info:
            await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "7" * 200}])
        return info.value

    _, gen, session, err = run(tok, lambda p, s: "x", long_prompt, max_context=64)
    assert err.code == "context_length_exceeded" and "rollout.max_episode_tokens" in err.message
    assert session.limit == "overflow" and gen.calls == []

    async def looping(client):
        for _ in range(5):
            await client.chat.completions.create(model=MODEL, messages=START)

    with pytest.raises(openai.BadRequestError, match="at most 2 calls"):
        run(tok, lambda p, s: "x", looping, max_calls=2)


def test_a_failing_generator_is_a_503_and_marks_the_session(tok):
    from agentrl.errors import GeneratorError

    async def broken(ids, params):
        raise GeneratorError("engine died")

    async def agent(client):
        with pytest.raises(openai.InternalServerError):
            await client.chat.completions.create(model=MODEL, messages=START)

    _, _, session, _ = run(tok, None, agent, generate=broken)
    assert "engine died" in session.infra_error


def test_a_body_that_is_not_json_is_a_400(tok):
    async def main():
        gw = Gateway(tok)
        await gw.start()
        url = gw.open(Session(recorder=ChatRecorder(tok), generate=None, defaults={}, max_new_tokens=4, max_context_tokens=64, max_calls=1))
        async with httpx.AsyncClient() as http:
            r = await http.post(f"{url}/chat/completions", content=b"{not json", headers={"Authorization": f"Bearer {gw.api_key}"})
        await gw.aclose()
        return r

    r = asyncio.run(main())
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_stop_strings_are_left_out_of_the_content_but_kept_in_the_ids_and_may_close_a_tool_call(tok):
    async def agent(client):
        plain = await client.chat.completions.create(model=MODEL, messages=START, stop=["</x>"])
        call = await client.chat.completions.create(model=MODEL, messages=START, tools=[PYTHON_TOOL], stop=["</tool_call>"])
        return plain, call

    def script(prompt, params):
        return CALL + " and more" if params.get("stop") == ["</tool_call>"] else "answer</x> never seen"

    traj, gen, _, (plain, call) = run(tok, script, agent)
    assert plain.choices[0].message.content == "answer" and plain.choices[0].finish_reason == "stop"
    assert tok.decode(gen.calls[0][2]) == "answer</x>"  # what was sampled, stop string included
    assert call.choices[0].finish_reason == "tool_calls" and call.choices[0].message.tool_calls[0].function.name == "python"
