"""docs/environments.md: the minimal tool environment is at most 30 lines and runs as written, and so does the PythonTool-in-ToolEnv example."""

import sys
from pathlib import Path

import anyio
import gymnasium
import pytest

from tests.doc_blocks import DOCS_DIR
from tests.doc_blocks import example as doc_example

DOC = DOCS_DIR / "environments.md"


def example(name: str) -> str:
    """The ```python block that follows ``<!-- example: name -->`` in the doc."""
    return doc_example(DOC, name)


@pytest.fixture
def doc_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "doc_envs.py").write_text(example("minimal-tool-env"))
    monkeypatch.syspath_prepend(str(tmp_path))
    import doc_envs

    yield doc_envs
    sys.modules.pop("doc_envs", None)
    gymnasium.registry.pop("my/Multiply-v0", None)


def test_minimal_example_is_at_most_30_lines() -> None:
    code = example("minimal-tool-env")
    assert len(code.rstrip("\n").splitlines()) <= 30


def test_usage_example_runs_as_written(doc_module) -> None:
    namespace = {"gymnasium": gymnasium}
    exec(compile(example("usage"), "usage", "exec"), namespace)
    assert namespace["reward"] == 1.0


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_minimal_env_async_episode(doc_module, backend: str) -> None:
    async def main() -> None:
        env = gymnasium.make("my/Multiply-v0").unwrapped
        env.reset(options={"row": {"question": "What is 6 * 7?", "answer": "42"}})
        obs, *_ = await env.astep('<tool_call>{"name": "multiply", "arguments": {"a": 6, "b": 7}}</tool_call>')
        assert obs == [{"role": "tool", "content": "<tool_response>\n42\n</tool_response>"}]
        obs, *_, info = await env.astep('<tool_call>{"name": "multiply", "arguments": {"a": 6}}</tool_call>')
        assert info["status"] == "malformed" and "missing required argument" in obs[0]["content"]
        _, reward, terminated, _, _ = await env.astep("\\boxed{42}")
        assert (reward, terminated) == (1.0, True)
        await env.aclose()

    anyio.run(main, backend=backend)


def test_minimal_env_from_a_recipe_reference(doc_module) -> None:
    from agentrl.envs import make_env

    env = make_env("doc_envs:MultiplyEnv", max_turns=2, malformed="end")
    assert type(env).__name__ == "MultiplyEnv" and env.max_turns == 2
    assert make_env("doc_envs:my/Multiply-v0").unwrapped.malformed == "feedback"


def _python_tool_example() -> tuple[str, str]:
    """The python-tool-env block without its last line, and that line (the run with bubblewrap)."""
    *body, last = example("python-tool-env").rstrip("\n").splitlines()
    assert last == "print(anyio.run(episode))  # 1.0"
    return "\n".join(body) + "\n", last


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_python_tool_env_example_runs_with_a_fake_sandbox(backend: str) -> None:
    """The PythonTool-in-ToolEnv example's episode (its asserts included) on the sandbox double
    the doc names for unit tests: the tool's cells run in one session, the variable persists."""
    from agentrl.sandbox.testing import FakeSessionSandbox

    body, _ = _python_tool_example()
    namespace: dict = {}
    exec(compile(body, "python-tool-env", "exec"), namespace)
    sandbox = FakeSessionSandbox()
    assert anyio.run(namespace["episode"], sandbox, backend=backend) == 1.0
    assert [cell.splitlines()[0] for cell in sandbox.sessions[0].cells] == ["squares = [i * i for i in range(1, 11)]", "_ = sum(squares)"]
    assert sandbox.sessions[0].exited  # aclose closed the episode's session; the given sandbox stays open
    assert sandbox.closed == 0


def test_python_tool_env_example_runs_as_written_in_bubblewrap(capsys: pytest.CaptureFixture[str]) -> None:
    """The block as written: its own bubblewrap sandbox, made at the first call, closed by aclose."""
    exec(compile(example("python-tool-env"), "python-tool-env", "exec"), {})
    assert capsys.readouterr().out == "1.0\n"
