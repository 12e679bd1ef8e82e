"""MathTool-v0 and Math-v0: registration, make, check_env, rewards, scripted episodes (fake and
real sandbox), infrastructure failures."""

import warnings

import anyio
import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

import agentrl.envs
from agentrl.envs import BUILTIN_ENVS, CalcEnv, MathEnv, MathToolEnv, make_env
from agentrl.envs.math_envs import MATH_PROMPT, MATH_TOOL_PROMPT
from agentrl.errors import EnvError, InfraError, SandboxError, VerifierError
from agentrl.sandbox.testing import FakeSandbox, FakeSessionSandbox

BACKENDS = ["asyncio", "trio"]
ROW = {"question": "Solve for x: 7x - 12 = 3x + 5.", "answer": "17/4"}


def test_builtins_are_registered() -> None:
    assert set(BUILTIN_ENVS) == {"agentrl/Calc-v0", "agentrl/MathTool-v0", "agentrl/Math-v0", "agentrl/Turns-v0"}
    for env_id, entry in BUILTIN_ENVS.items():
        assert gymnasium.registry[env_id].entry_point == entry


def test_make_math_envs() -> None:
    env = gymnasium.make("agentrl/MathTool-v0", sandbox=FakeSandbox(), max_turns=8, timeout_s=3.0)
    assert isinstance(env.unwrapped, MathToolEnv) and env.unwrapped.max_turns == 8
    assert env.unwrapped.timeout_s == 3.0
    assert isinstance(make_env("agentrl/Math-v0", sandbox=FakeSandbox()).unwrapped, MathEnv)
    assert type(make_env("agentrl.envs.math_envs:MathToolEnv", incorrect_reward=-1.0)) is MathToolEnv
    with pytest.raises(EnvError, match="'agentrl/MathTool-v0' cannot be built: max_turns must be >= 1"):
        make_env("agentrl/MathTool-v0", max_turns=0)
    # the value is checked against the constructor's annotation before the environment is built
    with pytest.raises(EnvError, match=r"env\.kwargs\.malformed: got 'explode' \(str\); MathToolEnv expects Literal"):
        make_env("agentrl/MathTool-v0", malformed="explode")


@pytest.mark.parametrize("env_id", sorted(BUILTIN_ENVS))
def test_check_env_on_every_builtin(env_id: str) -> None:
    env = gymnasium.make(env_id, sandbox=FakeSandbox())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped)
    env.close()


@pytest.mark.parametrize("env_cls", [MathToolEnv, MathEnv, CalcEnv])
def test_reset_without_a_row_is_seeded(env_cls: type) -> None:
    env = env_cls()
    a, _ = env.reset(seed=5)
    b, _ = env.reset(seed=5)
    c, _ = env.reset(seed=6)
    assert a == b and a != c


def test_prompts() -> None:
    obs, _ = MathToolEnv().reset(options={"row": dict(ROW)})
    assert obs[0]["content"].startswith(MATH_TOOL_PROMPT) and "<code>" in obs[0]["content"]
    assert obs[1] == {"role": "user", "content": ROW["question"]}
    obs, _ = MathEnv().reset(options={"row": dict(ROW)})
    assert obs == [{"role": "system", "content": MATH_PROMPT}, {"role": "user", "content": ROW["question"]}]
    obs, _ = MathEnv(system_prompt="Be brief.").reset(options={"row": {"question": "1+1?", "answer": 2}})
    assert obs[0]["content"] == "Be brief."


@pytest.mark.parametrize(
    ("answer", "reward", "correct"),
    [
        ("The answer is \\boxed{\\frac{17}{4}}.", 1.0, True),
        ("\\boxed{4.25}", 1.0, True),
        ("x = 17/4, so \\boxed{x = \\frac{17}{4}}", 1.0, True),
        ("\\boxed{4}", 0.0, False),
        ("I think it is 17/4.", 0.0, False),  # no box
    ],
)
def test_math_env_one_turn(answer: str, reward: float, correct: bool) -> None:
    env = MathEnv()
    env.reset(options={"row": dict(ROW)})
    obs, r, term, trunc, info = env.step(answer)
    assert (obs, r, term, trunc) == ([], reward, True, False)
    assert info["correct"] is correct and info["end_reason"] == "answer"


def test_math_env_ignores_code_tags() -> None:
    env = MathEnv(format_reward=0.1, incorrect_reward=-1.0)
    env.reset(options={"row": dict(ROW)})
    _, r, term, _, info = env.step("<code>print(1)</code> \\boxed{2}")
    assert term and r == pytest.approx(-0.9) and info["tool_calls"] == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_scripted_episode_with_session_state(backend: str) -> None:
    async def main() -> None:
        sandbox = FakeSessionSandbox()
        env = MathToolEnv(sandbox=sandbox, tool_use_reward=0.1, format_reward=0.1)
        env.reset(options={"row": dict(ROW)})
        obs, r, term, trunc, info = await env.astep(
            "Move the x terms.\n<code>\nfrom fractions import Fraction\nx = Fraction(5 + 12, 7 - 3)\nx\n</code>"
        )
        assert obs == [{"role": "tool", "content": "<interpreter>\nFraction(17, 4)\n</interpreter>"}]
        assert (r, term, trunc, info["tool_calls"]) == (0.0, False, False, 1)
        obs, *_ = await env.astep("Check: <code>7 * x - 12 == 3 * x + 5</code>")
        assert obs[0]["content"] == "<interpreter>\nTrue\n</interpreter>"
        obs, r, term, trunc, info = await env.astep("So \\boxed{\\frac{17}{4}}.")
        assert (obs, term, trunc) == ([], True, False) and r == pytest.approx(1.2)
        assert info["reward_terms"] == {"answer": 1.0, "format": 0.1, "tool_use": 0.1}
        assert len(sandbox.sessions) == 1
        await env.aclose()
        assert sandbox.sessions[0].exited and sandbox.closed == 0  # the shared sandbox stays open

    anyio.run(main, backend=backend)


def test_sessions_do_not_leak_between_episodes() -> None:
    async def main() -> None:
        sandbox = FakeSessionSandbox()
        env = MathToolEnv(sandbox=sandbox)
        env.reset(options={"row": dict(ROW)})
        await env.astep("<code>secret = 1</code>")
        env.reset(options={"row": dict(ROW)})
        obs, *_ = await env.astep("<code>secret</code>")
        assert "NameError" in obs[0]["content"]
        assert sandbox.sessions[0].exited and len(sandbox.sessions) == 2
        await env.aclose()

    anyio.run(main)


def test_sync_steps_keep_state() -> None:
    """Each sync step runs in its own event loop and closes the live session; the next restores it."""
    sandbox = FakeSessionSandbox()
    env = MathToolEnv(sandbox=sandbox)
    env.reset(options={"row": dict(ROW)})
    env.step("<code>y = 41</code>")
    obs, *_ = env.step("<code>y + 1</code>")
    assert obs[0]["content"] == "<interpreter>\n42\n</interpreter>"
    assert len(sandbox.sessions) == 2 and env.sessions["python"].restores == 1


def test_malformed_code_and_limits() -> None:
    env = MathToolEnv(sandbox=FakeSessionSandbox(), max_turns=3, max_output_chars=50)
    env.reset(options={"row": dict(ROW)})
    obs, r, term, trunc, info = env.step("Let me compute <code>print(1")  # cut off at max_tokens
    assert "ToolCallError: the <code> tag at character 15 is never closed" in obs[0]["content"]
    assert info["status"] == "malformed" and info["tool_errors"] == 1
    obs, *_ = env.step("<code>print('z' * 500)</code>")
    assert "characters cut" in obs[0]["content"]
    *_, trunc, info = env.step("<code>1</code>")
    assert trunc and info["end_reason"] == "max_turns"


@pytest.mark.parametrize("backend", BACKENDS)
def test_verifier_timeout_is_an_infra_failure_not_a_zero(backend: str) -> None:
    async def main() -> None:
        env = MathToolEnv(sandbox=FakeSandbox(), verifier_timeout_s=0.3)
        env.reset(options={"row": {"question": "q", "answer": "2"}})
        obs, r, term, trunc, info = await env.astep("\\boxed{9^{9^{9^{9}}}}")
        assert (obs, r, term, trunc) == ([], 0.0, False, True)
        assert info["status"] == "infra_failure" and info["infra_failure"] is True
        assert info["error"].startswith("VerifierError: ") and "timed out" in info["error"]
        assert issubclass(VerifierError, InfraError)  # what the engine keeps out of the loss

    anyio.run(main, backend=backend)


def test_sandbox_failure_is_an_infra_failure() -> None:
    env = MathToolEnv(sandbox=FakeSandbox(error=SandboxError("worker died")), session=False)
    env.reset(options={"row": dict(ROW)})
    obs, r, term, trunc, info = env.step("<code>1</code>")
    assert (obs, trunc, info["status"], info["error"]) == ([], True, "infra_failure", "SandboxError: worker died")


@pytest.mark.parametrize("backend", BACKENDS)
def test_mathtool_episode_through_the_real_sandbox(backend: str) -> None:
    """A scripted policy plays MathTool-v0 against the real bubblewrap sandbox (session per episode)."""
    from agentrl.sandbox import create_sandbox

    async def main() -> None:
        sandbox = create_sandbox("bubblewrap")
        try:
            env = make_env("agentrl/MathTool-v0", sandbox=sandbox, timeout_s=5.0, memory_mb=256)
            base = env.unwrapped
            base.reset(seed=0, options={"row": dict(ROW)})
            obs, *_ = await base.astep("<code>\nfrom fractions import Fraction\nx = Fraction(17, 4)\nprint(x)\n</code>")
            assert obs == [{"role": "tool", "content": "<interpreter>\n17/4\n</interpreter>"}]
            obs, *_ = await base.astep("<code>7 * x - 12 == 3 * x + 5</code>")  # state kept, value shown
            assert obs[0]["content"] == "<interpreter>\nTrue\n</interpreter>"
            obs, _, _, _, info = await base.astep("<code>x / 0</code>")
            assert "ZeroDivisionError" in obs[0]["content"] and info["tool_errors"] == 1
            obs, r, term, trunc, info = await base.astep("Therefore \\boxed{\\frac{17}{4}}")
            assert (r, term, trunc, info["correct"], info["tool_calls"]) == (1.0, True, False, True, 3)
            await base.aclose()
        finally:
            await sandbox.aclose()

    anyio.run(main, backend=backend)


def test_reimport_does_not_register_twice() -> None:
    import importlib

    specs = {k: gymnasium.registry[k] for k in BUILTIN_ENVS}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        importlib.reload(agentrl.envs)
    assert {k: gymnasium.registry[k] for k in BUILTIN_ENVS} == specs
