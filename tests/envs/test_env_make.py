import importlib
import sys
import textwrap
import warnings
from pathlib import Path

import gymnasium
import pytest

import agentrl.envs
from agentrl.envs import CalcEnv, make_env
from agentrl.errors import EnvError
from agentrl.sandbox.testing import FakeSandbox


def test_calc_is_registered_once() -> None:
    assert "agentrl/Calc-v0" in gymnasium.registry
    spec = gymnasium.registry["agentrl/Calc-v0"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # gymnasium warns when an id is registered twice
        importlib.reload(agentrl.envs)
    assert gymnasium.registry["agentrl/Calc-v0"] == spec


def test_make_env_registered_id() -> None:
    env = make_env("agentrl/Calc-v0", sandbox=FakeSandbox(), max_turns=2)
    assert isinstance(env.unwrapped, CalcEnv) and env.unwrapped.max_turns == 2


def test_make_env_module_class() -> None:
    env = make_env("agentrl.envs.calc:CalcEnv", sandbox=FakeSandbox(), timeout_s=1.0)
    assert type(env) is CalcEnv and env.timeout_s == 1.0


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A user's module that defines an env and registers it on import."""
    (tmp_path / "my_user_envs.py").write_text(
        textwrap.dedent(
            '''
            import gymnasium
            from agentrl.envs import TextEnv

            class EchoEnv(TextEnv):
                def initial_messages(self, row):
                    return [{"role": "user", "content": row.get("question", "say hi")}]

                def step(self, action):  # a sync env: the base astep runs this in a thread
                    self.start_turn()
                    self.done = True
                    return [], float(action == "hi"), True, False, self.make_info("ok")

            if "test-user/Echo-v0" not in gymnasium.registry:
                gymnasium.register(id="test-user/Echo-v0", entry_point=EchoEnv)
            '''
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_user_envs"
    sys.modules.pop("my_user_envs", None)
    gymnasium.registry.pop("test-user/Echo-v0", None)


def test_make_env_user_module_registers_its_ids(user_module: str) -> None:
    import anyio

    env = make_env(f"{user_module}:EchoEnv")
    assert type(env).__name__ == "EchoEnv"
    assert "test-user/Echo-v0" in gymnasium.registry  # importing the module registered it
    env.reset(options={"row": {"question": "q"}})
    assert anyio.run(env.astep, "hi")[1] == 1.0
    by_id = make_env(f"{user_module}:test-user/Echo-v0")
    assert type(by_id.unwrapped).__name__ == "EchoEnv"
    assert make_env("test-user/Echo-v0").unwrapped.__class__.__name__ == "EchoEnv"


@pytest.mark.parametrize(
    ("env_id", "kwargs", "needle"),
    [
        ("agentrl/Nope-v0", {}, "unknown environment 'agentrl/Nope-v0'"),
        ("Nope", {}, "unknown environment 'Nope'"),
        ("no_such_module_xyz:Env", {}, "cannot import module 'no_such_module_xyz'"),
        ("agentrl.envs.calc:Nope", {}, "has no gymnasium.Env subclass named 'Nope'"),
        ("agentrl.envs.calc:generate_problems", {}, "has no gymnasium.Env subclass"),
        ("agentrl/Calc-v0", {"bogus": 1}, "'agentrl/Calc-v0': env.kwargs.bogus: CalcEnv has no parameter 'bogus' (its parameters: sandbox, max_turns"),
        ("agentrl.envs.calc:CalcEnv", {"max_turns": 0}, "'agentrl.envs.calc:CalcEnv' cannot be built"),
    ],
)
def test_make_env_errors_name_the_id(env_id: str, kwargs: dict, needle: str) -> None:
    with pytest.raises(EnvError, match=needle.replace("(", r"\(")):
        make_env(env_id, **kwargs)
