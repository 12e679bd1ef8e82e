"""agentrl/Turns-v0: episodes of a given number of turns (agentrl.envs.turns)."""

from __future__ import annotations

import gymnasium
import pytest

import agentrl  # noqa: F401  (registers the ids)
from agentrl.envs.data import load_rows
from agentrl.envs.turns import turn_rows
from agentrl.errors import ConfigError, DataError


def test_an_episode_lasts_exactly_its_turns_and_rewards_the_number() -> None:
    for turns, said, reward in ((1, "it was 1", 1.0), (3, "3", 1.0), (4, "no idea", 0.0)):
        env = gymnasium.make("agentrl/Turns-v0")
        row = {"question": f"We will talk for {turns} turns.", "answer": str(turns), "turns": turns}
        obs, _ = env.reset(options={"row": row})
        assert [m["role"] for m in obs] == ["system", "user"]
        for k in range(turns - 1):
            new, r, term, trunc, info = env.step("fine")
            assert r == 0.0 and not term and not trunc and new[0]["role"] == "user" and info["status"] == "ok"
        assert "Last turn" in new[0]["content"] if turns > 1 else True
        new, r, term, trunc, _ = env.step(said)
        assert (new, r, term, trunc) == ([], reward, True, False)


def test_rows_spread_over_one_to_eight_turns_and_repeat_with_the_seed() -> None:
    rows = load_rows("synthetic:turns", limit=400, seed=3)
    counts = {k: sum(r["turns"] == k for r in rows) for k in range(1, 9)}
    assert all(c > 20 for c in counts.values()) and sum(counts.values()) == 400
    assert rows == load_rows("synthetic:turns", limit=400, seed=3) != load_rows("synthetic:turns", limit=400, seed=4)
    assert turn_rows(2, 0, min_turns=5, max_turns=5)[0]["turns"] == 5
    with pytest.raises(ConfigError):
        turn_rows(1, 0, min_turns=3, max_turns=2)


def test_a_bad_turn_count_names_the_field() -> None:
    env = gymnasium.make("agentrl/Turns-v0")
    with pytest.raises(DataError, match="'turns' must be an integer"):
        env.reset(options={"row": {"question": "q", "answer": "1", "turns": "many"}})
    with pytest.raises(DataError, match="at least 1"):
        env.reset(options={"row": {"question": "q", "answer": "1", "turns": 0}})
