"""env.kwargs are checked against the environment's signature and annotations, naming the kwarg
(make_env, and `agentrl check --dry-run` through the CLI)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.cli import main
from agentrl.envs import make_env
from agentrl.errors import EnvError

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "env_id, kwargs, message",
    [
        ("agentrl/Calc-v0", {"max_turns": "3"}, r"env\.kwargs\.max_turns: got '3' \(str\); CalcEnv expects int"),
        ("agentrl/Calc-v0", {"timeout_s": "slow"}, r"env\.kwargs\.timeout_s: got 'slow' \(str\); CalcEnv expects float \| None"),
        ("agentrl.envs.calc:CalcEnv", {"max_turn": 3}, r"env\.kwargs\.max_turn: CalcEnv has no parameter 'max_turn' \(its parameters: sandbox, max_turns"),
        ("agentrl/MathTool-v0", {"max_turns": 2.5}, r"env\.kwargs\.max_turns: got 2\.5 \(float\); MathToolEnv expects int"),
        ("agentrl/Math-v0", {"system_prompt": 7}, r"env\.kwargs\.system_prompt: got 7 \(int\); MathEnv expects str \| None"),
    ],
)
def test_a_wrong_kwarg_is_named_with_what_the_signature_expects(env_id, kwargs, message):
    with pytest.raises(EnvError, match=message):
        make_env(env_id, **kwargs)


def test_right_kwargs_pass_and_ints_are_numbers():
    make_env("agentrl/Calc-v0", max_turns=2, timeout_s=3).close()  # an int where a float is annotated is fine


def test_check_dry_run_names_the_kwarg(tiny_calc_model, capsys):
    rc = main(["check", str(REPO / "recipes" / "tiny_calc.toml"), "--dry-run", "--set", f"model.path='{tiny_calc_model}'",
               "--set", "env.kwargs.max_turns='3'", "--set", "sandbox.type='unsafe-local'", "--set", "sandbox.preload=null"])
    out = capsys.readouterr().out
    assert rc == 2
    assert "env.kwargs.max_turns: got '3' (str); CalcEnv expects int" in out, out
