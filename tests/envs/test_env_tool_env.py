"""ToolEnv: turns, tool calls, limits, truncation, the malformed-call policies, infra failures."""

import json
import warnings

import anyio
import pytest
from gymnasium.utils.env_checker import check_env

from agentrl.envs import ToolEnv, extract_boxed
from agentrl.envs.tools import PythonTool
from agentrl.errors import ConfigError, EnvError, SandboxError, VerifierError
from agentrl.sandbox.testing import FakeSandbox

BACKENDS = ["asyncio", "trio"]
ROW = {"question": "What is 12 * 34 + 5?", "answer": "413"}


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor.
        b: the second factor.
    """
    return a * b


async def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def shout(text: str) -> str:
    """Repeat the text many times."""
    return text * 1000


def fail_infra() -> str:
    """A tool whose backend is down."""
    raise SandboxError("tool backend down")


class ArithEnv(ToolEnv):
    tools = [multiply, add, shout, fail_infra]
    system_prompt = "Use the tools, then answer in \\boxed{}."

    def reward(self, action: str, row: dict) -> float:
        return float(extract_boxed(action) == row["answer"])


def call(name: str, **args: object) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


def fresh(**kwargs: object) -> ArithEnv:
    env = ArithEnv(**kwargs)  # type: ignore[arg-type]
    env.reset(options={"row": dict(ROW)})
    return env


def test_reset_describes_the_tools() -> None:
    env = ArithEnv()
    obs, info = env.reset(options={"row": dict(ROW)})
    assert [m["role"] for m in obs] == ["system", "user"] and obs[1]["content"] == ROW["question"]
    system = obs[0]["content"]
    assert system.startswith("Use the tools, then answer in \\boxed{}.\n\n") and "<tools>" in system
    assert json.dumps(env.toolbox["multiply"].schema()) in system
    assert info == {"status": "ok", "infra_failure": False, "tool_calls": 0, "tool_errors": 0}
    assert obs in env.observation_space


@pytest.mark.parametrize("backend", BACKENDS)
def test_episode_with_tool_calls(backend: str) -> None:
    async def main() -> None:
        env = fresh()
        obs, r, term, trunc, info = await env.astep("First " + call("multiply", a=12, b=34) + call("add", a=408, b=5))
        assert obs == [
            {"role": "tool", "content": "<tool_response>\n408\n</tool_response>"},
            {"role": "tool", "content": "<tool_response>\n413\n</tool_response>"},
        ]
        assert (r, term, trunc) == (0.0, False, False)
        assert info == {"status": "ok", "infra_failure": False, "tool_calls": 2, "tool_errors": 0}
        obs, r, term, trunc, info = await env.astep("So \\boxed{413}.")
        assert (obs, r, term, trunc) == ([], 1.0, True, False)
        assert info["end_reason"] == "answer" and info["tool_calls"] == 2
        with pytest.raises(EnvError, match="after the episode ended"):
            await env.astep("again")

    anyio.run(main, backend=backend)


def test_qwen_format_leaves_the_tags_to_the_template() -> None:
    env = fresh(tool_format="qwen")
    obs, *_ = env.step(call("multiply", a=2, b=3))
    assert obs == [{"role": "tool", "content": "6"}]


@pytest.mark.parametrize(
    ("action", "needle"),
    [
        (call("divide", a=1, b=2), "ToolCallError: unknown tool 'divide' (tools: add, fail_infra, multiply, shout)"),
        (call("multiply", a=1), "ToolCallError: multiply() is missing required argument(s) ['b']"),
        (call("multiply", a="1", b=2), "ToolCallError: multiply() argument 'a': expected integer, got string"),
        ("<tool_call>{not json}</tool_call>", "ToolCallError: the <tool_call> at character 0 is not valid JSON"),
        ('<tool_call>{"name": "multiply", "arguments": {"a": 1,', "never closed"),
    ],
)
def test_malformed_feedback(action: str, needle: str) -> None:
    env = fresh()
    obs, r, term, trunc, info = env.step(action)
    assert len(obs) == 1 and needle in obs[0]["content"], obs
    assert (r, term, trunc) == (0.0, False, False)
    assert info == {"status": "malformed", "infra_failure": False, "tool_calls": 1, "tool_errors": 1}


def test_malformed_feedback_still_runs_the_good_calls() -> None:
    env = fresh()
    obs, _, _, _, info = env.step(call("multiply", a=2, b=3) + call("nope") + call("add", a=1, b=1))
    assert [m["content"].splitlines()[1] for m in obs] == ["6", "ToolCallError: unknown tool 'nope' (tools: add, fail_infra, multiply, shout)", "2"]
    assert (info["status"], info["tool_calls"], info["tool_errors"]) == ("malformed", 3, 1)


def test_malformed_penalty() -> None:
    env = fresh(malformed="penalty", malformed_penalty=0.25)
    obs, r, term, trunc, info = env.step(call("nope") + call("multiply", a=1) + call("add", a=1, b=2))
    assert r == -0.5 and not term and not trunc and info["status"] == "malformed"
    assert obs[2]["content"] == "<tool_response>\n3\n</tool_response>"
    _, r, *_ = env.step(call("add", a=1, b=2))
    assert r == 0.0


def test_malformed_end() -> None:
    env = fresh(malformed="end")
    obs, r, term, trunc, info = env.step(call("multiply", a=2, b=3) + "<tool_call>{oops</tool_call>")
    assert (obs, r, term, trunc) == ([], 0.0, True, False)
    assert info["status"] == "ok" and info["end_reason"] == "malformed" and "not valid JSON" in info["malformed"][0]
    assert (info["tool_calls"], info["tool_errors"]) == (2, 1)


def test_max_turns_truncates() -> None:
    env = fresh(max_turns=2)
    assert env.step(call("add", a=1, b=1))[3] is False
    obs, r, term, trunc, info = env.step(call("add", a=2, b=2))
    assert obs[0]["content"] == "<tool_response>\n4\n</tool_response>"
    assert (r, term, trunc, info["status"], info["end_reason"]) == (0.0, False, True, "truncated", "max_turns")


def test_max_tool_calls_truncates() -> None:
    env = fresh(max_tool_calls=3)
    env.step(call("add", a=1, b=1) + call("add", a=1, b=1))
    obs, r, term, trunc, info = env.step(call("add", a=2, b=2) + call("add", a=3, b=3))
    assert obs[0]["content"] == "<tool_response>\n4\n</tool_response>"
    assert "limit of 3 tool calls per episode is reached" in obs[1]["content"]
    assert (term, trunc, info["status"], info["end_reason"]) == (False, True, "truncated", "max_tool_calls")
    assert (info["tool_calls"], info["tool_errors"]) == (4, 1)


def test_long_outputs_keep_head_and_tail() -> None:
    env = fresh(max_output_chars=100)
    obs, *_ = env.step(call("shout", text="ab"))
    content = obs[0]["content"]
    assert "[... 1900 characters cut ...]" in content and content.startswith("<tool_response>\nababab")
    assert len(content) < 200


@pytest.mark.parametrize("backend", BACKENDS)
def test_infra_error_from_a_tool(backend: str) -> None:
    async def main() -> None:
        env = fresh()
        obs, r, term, trunc, info = await env.astep(call("fail_infra"))
        assert (obs, r, term, trunc) == ([], 0.0, False, True)
        assert info["infra_failure"] is True and info["error"] == "SandboxError: tool backend down"

    anyio.run(main, backend=backend)


def test_verifier_error_in_reward_is_an_infra_failure() -> None:
    class Flaky(ArithEnv):
        async def reward(self, action: str, row: dict) -> float:  # type: ignore[override]
            raise VerifierError("verifier timed out")

    env = Flaky()
    env.reset(options={"row": dict(ROW)})
    obs, r, term, trunc, info = env.step("\\boxed{413}")
    assert (obs, r, term, trunc, info["status"]) == ([], 0.0, False, True, "infra_failure")


def test_async_reward() -> None:
    class AsyncReward(ArithEnv):
        async def reward(self, action: str, row: dict) -> float:  # type: ignore[override]
            await anyio.sleep(0)
            return 0.5

    env = AsyncReward()
    env.reset(options={"row": dict(ROW)})
    assert env.step("done")[1] == 0.5


def test_no_reward_implemented() -> None:
    class NoReward(ToolEnv):
        tools = [multiply]

    env = NoReward()
    env.reset(options={"row": dict(ROW)})
    with pytest.raises(NotImplementedError, match="must implement reward"):
        env.step("done")


def test_sandbox_tool_in_a_hermes_env() -> None:
    class CodeEnv(ArithEnv):
        tools = [multiply, PythonTool(session=False)]

    sandbox = FakeSandbox()
    env = CodeEnv(sandbox=sandbox, timeout_s=3.0, memory_mb=100)
    env.reset(options={"row": dict(ROW)})
    obs, *_ = env.step(call("python", code="print(12 * 34 + 5)"))
    assert obs == [{"role": "tool", "content": "<tool_response>\n413\n</tool_response>"}]
    assert sandbox.calls == [("print(12 * 34 + 5)", 3.0, 100)]


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"max_turns": 0}, "max_turns"),
        ({"max_tool_calls": -1}, "max_tool_calls"),
        ({"max_output_chars": 0}, "max_output_chars"),
        ({"malformed": "ignore"}, "malformed must be"),
        ({"malformed_penalty": -1.0}, "malformed_penalty"),
        ({"tools": [multiply, multiply]}, "two tools are named 'multiply'"),
        ({"tool_format": None}, "need a tool_format"),
        ({"tool_format": "retool"}, "use 'hermes'"),
        ({"tool_format": "xml"}, "unknown tool-call parser"),
    ],
)
def test_bad_arguments_are_config_errors(kwargs: dict, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        ArithEnv(**kwargs)


def test_check_env_on_a_user_tool_env() -> None:
    class Sampled(ArithEnv):
        def sample_row(self) -> dict:
            return {"question": f"{int(self.np_random.integers(100))} * 2?", "answer": "0"}

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", message=".*not having a spec")  # made without gymnasium.make
        check_env(Sampled())
