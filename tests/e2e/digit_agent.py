"""An agent program for the end-to-end test: two model calls (the second continues the first), a
sandbox execution in between, reward 1 when the first reply starts with a digit (the untrained
tiny model earns it sometimes, so there is a learning signal)."""

from agentrl.agents import MODEL, AgentResult, run_code


async def digit_agent(client, row):
    messages = [{"role": "user", "content": row["question"]}]
    first = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    text = first.choices[0].message.content or ""
    measured = await run_code(f"print(len({text!r}) + 1000)")
    messages += [first.choices[0].message, {"role": "user", "content": f"tool says {measured}"}]
    await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    return AgentResult(reward=1.0 if text[:1].isdigit() else 0.0, info={"tool": measured})
