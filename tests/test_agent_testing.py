"""Testing an agent offline (agentrl.agent_testing): the docs' agent and its offline test run as
written, the scripted replies are the OpenAI SDK's own types, and a script that runs out says so."""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import pytest

from agentrl.agent_testing import ScriptedClient, play_offline, tool_call
from agentrl.errors import AgentRLError
from agentrl.sandbox.testing import FakeSandbox
from tests.doc_blocks import DOCS_DIR
from tests.doc_blocks import example as doc_example

DOC = DOCS_DIR / "agents.md"


def example(name: str) -> str:
    return doc_example(DOC, name)


@pytest.fixture
def my_agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "my_agent.py").write_text(example("my-agent"))
    monkeypatch.syspath_prepend(str(tmp_path))
    import my_agent

    yield my_agent
    sys.modules.pop("my_agent", None)


def test_the_docs_agent_and_its_offline_test_run_as_written(my_agent) -> None:
    exec(compile(example("agent-offline"), "agent-offline", "exec"), {})


def test_a_scripted_reply_reads_as_the_sdks_chat_completion(my_agent) -> None:
    from openai.types.chat import ChatCompletionMessage

    client = ScriptedClient([tool_call("python", {"code": "print(1 + 1)"}), "it is 2"])
    sandbox = FakeSandbox()
    reward = anyio.run(play_offline, my_agent.agent, {"question": "1 + 1?", "answer": "2"}, client, sandbox)
    assert reward == 1.0
    assert [code for code, *_ in sandbox.calls] == ["print(1 + 1)"]  # run_code reached the episode's sandbox
    first, second = client.requests
    assert first["model"] == "policy" and first["tools"][0]["function"]["name"] == "python"
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": "call_1_0", "content": "2"}
    assert isinstance(second["messages"][1], ChatCompletionMessage)  # the agent appended the SDK's own message


def test_a_wrong_answer_scores_zero_and_an_exhausted_script_is_an_error(my_agent) -> None:
    client = ScriptedClient(["it is 5"])
    assert anyio.run(play_offline, my_agent.agent, {"question": "2 + 2?", "answer": "4"}, client, FakeSandbox()) == 0.0
    looping = ScriptedClient([tool_call("python", {"code": "print(0)"})])
    with pytest.raises(AgentRLError, match="call 2 asked for a reply, but only 1 were scripted"):
        anyio.run(play_offline, my_agent.agent, {"question": "q", "answer": "a"}, looping, FakeSandbox())


def test_run_code_outside_play_offline_has_no_sandbox(my_agent) -> None:
    from agentrl.errors import InfraError

    client = ScriptedClient([tool_call("python", {"code": "print(0)"}), "done"])
    with pytest.raises(InfraError, match="no sandbox"):
        anyio.run(play_offline, my_agent.agent, {"question": "q", "answer": "a"}, client, None)
