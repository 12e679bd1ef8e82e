import warnings

import anyio
import gymnasium
import pytest
from tests.envs.envfakes import ROW
from gymnasium.utils.env_checker import check_env

import agentrl.envs  # noqa: F401  (registers agentrl/Calc-v0)
from agentrl.envs.calc import SYSTEM_PROMPT, CalcEnv, as_int, generate_problems, prepare_code, sample_texts
from agentrl.errors import DataError, EnvError, SandboxError
from agentrl.sandbox.testing import FakeResult, FakeSandbox

BACKENDS = ["asyncio", "trio"]


def fresh(**kwargs) -> tuple[CalcEnv, FakeSandbox]:
    sandbox = kwargs.pop("sandbox", None) or FakeSandbox()
    env = CalcEnv(sandbox=sandbox, **kwargs)
    env.reset(seed=0, options={"row": dict(ROW)})
    return env, sandbox


def test_reset_returns_system_and_user() -> None:
    env = CalcEnv(sandbox=FakeSandbox())
    obs, info = env.reset(options={"row": dict(ROW)})
    assert obs == [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "Compute 347*58+91."}]
    assert info == {"status": "ok", "infra_failure": False, "tool_calls": 0, "tool_errors": 0}
    assert obs in env.observation_space


def test_reset_without_row_draws_a_seeded_problem() -> None:
    env = CalcEnv(sandbox=FakeSandbox())
    a, _ = env.reset(seed=7)
    b, _ = env.reset(seed=7)
    c, _ = env.reset(seed=8)
    assert a == b and a != c
    assert a[1]["content"].startswith("Compute ")


def test_reset_rejects_bad_rows() -> None:
    env = CalcEnv(sandbox=FakeSandbox())
    with pytest.raises(DataError, match="'answer'"):
        env.reset(options={"row": {"question": "Compute 1*2+3."}})
    with pytest.raises(DataError, match="not an integer"):
        env.reset(options={"row": {"question": "q", "answer": "seven"}})


@pytest.mark.parametrize(
    ("action", "reward"),
    [
        ("The answer is \\boxed{20217}.", 1.0),
        ("\\boxed{20,217}", 1.0),
        ("\\boxed{ 20217 }", 1.0),
        ("I guess \\boxed{20218}", 0.0),
        ("\\boxed{20217} no wait \\boxed{3}", 0.0),
        ("\\boxed{20217", 0.0),  # malformed box
        ("\\boxed{20217.0}", 0.0),
        ("\\boxed{x}", 0.0),
        ("20217", 0.0),  # no box
    ],
)
def test_final_answer_reward(action: str, reward: float) -> None:
    env, sandbox = fresh()
    obs, r, terminated, truncated, info = env.step(action)
    assert (obs, r, terminated, truncated) == ([], reward, True, False)
    assert info["status"] == "ok" and info["infra_failure"] is False
    assert sandbox.calls == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_code_block_gives_interpreter_message(backend: str) -> None:
    async def main() -> None:
        env, sandbox = fresh(timeout_s=2.5, memory_mb=128)
        obs, r, terminated, truncated, info = await env.astep("Let me compute.\n<code>print(347*58+91)</code>")
        assert obs == [{"role": "tool", "content": "<interpreter>\n20217\n</interpreter>"}]
        assert (r, terminated, truncated) == (0.0, False, False)
        assert info == {"status": "ok", "infra_failure": False, "tool_calls": 1, "tool_errors": 0}
        assert sandbox.calls == [("print(347*58+91)", 2.5, 128)]
        obs, r, terminated, truncated, info = await env.astep("\\boxed{20217}")
        assert (obs, r, terminated, truncated) == ([], 1.0, True, False)
        assert info["tool_calls"] == 1

    anyio.run(main, backend=backend)


def test_expression_only_code_is_printed() -> None:
    env, sandbox = fresh()
    obs, *_ = env.step("<code>347*58+91</code>")
    assert obs[0]["content"] == "<interpreter>\n20217\n</interpreter>"
    assert prepare_code("x = 2\nx") == "x = 2\nx"
    assert prepare_code("print(3)") == "print(3)"
    assert prepare_code("f(") == "f("
    for deep in ("+".join(["1"] * 5000), "+".join(["1"] * 1500)):  # too deep to parse; too deep to write back
        assert prepare_code(deep) == deep
    assert "print(repr(__value))" in prepare_code("'a' + 'b'")


def test_code_errors_are_shown_and_counted() -> None:
    env, _ = fresh()
    obs, r, terminated, truncated, info = env.step("<code>print('hi')\n1/0</code>")
    content = obs[0]["content"]
    assert content.startswith("<interpreter>\nhi\n") and "ZeroDivisionError: division by zero" in content
    assert content.endswith("\n</interpreter>")
    assert (r, terminated, truncated) == (0.0, False, False)
    assert info["tool_calls"] == 1 and info["tool_errors"] == 1 and info["status"] == "ok"


@pytest.mark.parametrize(
    ("result", "needle"),
    [
        (FakeResult("", timed_out=True, exit_code=None), "TimeoutError: the code ran longer than 5 s"),
        (FakeResult("", memory_exceeded=True, exit_code=None), "MemoryError: the code used more than 256 MB"),
        (FakeResult("", exit_code=3), "the code exited with status 3"),
    ],
)
def test_limits_are_reported_to_the_model(result: FakeResult, needle: str) -> None:
    env, _ = fresh(sandbox=FakeSandbox(reply=lambda code: result), timeout_s=5.0, memory_mb=256)
    obs, _, _, _, info = env.step("<code>while True: pass</code>")
    assert needle in obs[0]["content"]
    assert info["tool_errors"] == 1


def test_long_output_is_cut_to_its_tail() -> None:
    env, _ = fresh(sandbox=FakeSandbox(reply=lambda code: FakeResult("x" * 5000 + "END")))
    content = env.step("<code>print('x'*5000)</code>")[0][0]["content"]
    assert "[... output truncated]" in content and content.endswith("END\n</interpreter>") and len(content) < 2100


def test_malformed_code_tag_gives_feedback() -> None:
    env, sandbox = fresh()
    obs, r, terminated, truncated, info = env.step("<code>print(1)")
    assert obs[0]["role"] == "tool"
    assert obs[0]["content"].startswith("<interpreter>\nToolCallError: the <code> tag at character 0 is never closed")
    assert (r, terminated, truncated) == (0.0, False, False)
    assert info == {"status": "malformed", "infra_failure": False, "tool_calls": 1, "tool_errors": 1}
    assert sandbox.calls == []


def test_max_turns_truncates() -> None:
    env, _ = fresh(max_turns=2)
    assert env.step("<code>print(1)</code>")[3] is False
    obs, r, terminated, truncated, info = env.step("<code>print(2)</code>")
    assert obs[0]["content"] == "<interpreter>\n2\n</interpreter>"
    assert (r, terminated, truncated) == (0.0, False, True)
    assert info["status"] == "truncated" and info["tool_calls"] == 2
    with pytest.raises(EnvError, match="after the episode ended"):
        env.step("\\boxed{20217}")


def test_malformed_on_last_turn_truncates() -> None:
    env, _ = fresh(max_turns=1)
    _, _, terminated, truncated, info = env.step("<code>oops")
    assert (terminated, truncated, info["status"]) == (False, True, "truncated")


@pytest.mark.parametrize("backend", BACKENDS)
def test_sandbox_error_is_an_infra_failure_not_a_reward(backend: str) -> None:
    async def main() -> None:
        env, _ = fresh(sandbox=FakeSandbox(error=SandboxError("worker died")))
        obs, r, terminated, truncated, info = await env.astep("<code>print(1)</code>")
        assert obs == [] and truncated is True and terminated is False
        assert info["infra_failure"] is True and info["status"] == "infra_failure"
        assert info["error"] == "SandboxError: worker died"
        assert info["tool_errors"] == 0
        with pytest.raises(EnvError):
            await env.astep("\\boxed{20217}")

    anyio.run(main, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_hung_sandbox_is_an_infra_failure(backend: str) -> None:
    async def main() -> None:
        env, _ = fresh(sandbox=FakeSandbox(hang=True), timeout_s=0.01)
        env.deadline_grace_s = 0.05
        _, _, _, truncated, info = await env.astep("<code>print(1)</code>")
        assert truncated and info["status"] == "infra_failure" and "no result within" in info["error"]

    anyio.run(main, backend=backend)


def test_step_before_reset_and_inside_event_loop() -> None:
    env = CalcEnv(sandbox=FakeSandbox())
    with pytest.raises(EnvError, match="before reset"):
        env.step("hi")
    env.reset(options={"row": dict(ROW)})

    async def main() -> None:
        with pytest.raises(EnvError, match="running asyncio event loop"):
            env.step("\\boxed{1}")

    anyio.run(main)


def test_own_sandbox_is_created_lazily_and_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[tuple[str, FakeSandbox]] = []

    def create_sandbox(kind: str, **kwargs: object) -> FakeSandbox:
        made.append((kind, FakeSandbox()))
        return made[-1][1]

    import agentrl.sandbox

    monkeypatch.setattr(agentrl.sandbox, "create_sandbox", create_sandbox, raising=False)
    env = CalcEnv()  # sandbox=None -> its own "bubblewrap" sandbox, made at the first code call
    env.reset(options={"row": dict(ROW)})
    assert made == []
    env.step("<code>print(1)</code>")
    env.step("<code>print(2)</code>")
    # each sync step runs in its own event loop, so the env's own sandbox is closed after it
    assert [k for k, _ in made] == ["bubblewrap", "bubblewrap"] and all(s.closed == 1 for _, s in made)

    async def main() -> None:
        env.reset(options={"row": dict(ROW)})
        await env.astep("<code>print(1)</code>")
        await env.astep("<code>print(2)</code>")
        assert len(made) == 3 and made[-1][1].closed == 0 and env.holds_async_resources()
        with pytest.warns(ResourceWarning):
            env.close()
        await env.aclose()
        assert made[-1][1].closed == 1 and not env.holds_async_resources()

    anyio.run(main)


def test_shared_sandbox_is_never_closed_by_the_env() -> None:
    env, sandbox = fresh()
    env.step("<code>print(1)</code>")
    env.close()
    assert sandbox.closed == 0


def test_gymnasium_make_and_check_env() -> None:
    sandbox = FakeSandbox()
    env = gymnasium.make("agentrl/Calc-v0", sandbox=sandbox, max_turns=4)
    assert isinstance(env.unwrapped, CalcEnv) and env.unwrapped.max_turns == 4
    obs, info = env.reset(seed=3, options={"row": dict(ROW)})
    assert obs[1]["content"] == ROW["question"]
    obs, *_ = env.step("<code>print(6*7)</code>")
    assert obs[0]["content"] == "<interpreter>\n42\n</interpreter>"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # check_env reports problems as warnings too
        check_env(env.unwrapped)
    env.close()


def test_spaces_contain_what_the_env_returns() -> None:
    env, _ = fresh()
    assert env.action_space.contains("any text, even ünïcödé and <code>")
    assert env.observation_space.contains([{"role": "tool", "content": "é\n"}])
    assert not env.observation_space.contains([{"role": "tool"}])
    assert isinstance(env.observation_space.sample(), list)


def test_generate_problems_is_deterministic() -> None:
    rows = generate_problems(50, seed=1)
    assert rows == generate_problems(50, seed=1) and rows != generate_problems(50, seed=2)
    for row in rows:
        expr = row["question"].removeprefix("Compute ").removesuffix(".")
        a, rest = expr.split("*")
        b, c = rest.split("+")
        assert len(a) == 3 and len(b) == 2 and len(c) == 2
        assert int(row["answer"]) == int(a) * int(b) + int(c)


def test_sample_texts_are_whole_episodes() -> None:
    texts = sample_texts(20, seed=0)
    assert len(texts) == 20 and texts == sample_texts(20, seed=0)
    for t in texts:
        assert SYSTEM_PROMPT in t and "<code>" in t and "</code>" in t
        assert "<interpreter>\n" in t and "\\boxed{" in t and "<|im_start|>tool\n" in t


def test_as_int() -> None:
    assert as_int(" 20,217 ") == 20217 and as_int("-5") == -5
    assert as_int("") is None and as_int("1.0") is None and as_int("²") is None


@pytest.mark.parametrize("backend", BACKENDS)
def test_sync_step_from_a_worker_thread(backend: str) -> None:
    async def main() -> None:
        env, _ = fresh()
        obs, *_ = await anyio.to_thread.run_sync(env.step, "<code>print(2)</code>")
        assert obs[0]["content"] == "<interpreter>\n2\n</interpreter>"

    anyio.run(main, backend=backend)


def test_none_limits_defer_to_the_sandbox() -> None:
    timed_out = FakeResult("", timed_out=True, exit_code=None)
    env, sandbox = fresh(sandbox=FakeSandbox(reply=lambda code: timed_out), timeout_s=None, memory_mb=None)
    obs, *_ = env.step("<code>print(1)</code>")
    assert sandbox.calls == [("print(1)", None, None)]
    assert "ran longer than its time limit" in obs[0]["content"]
