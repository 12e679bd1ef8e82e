"""The rollout worker's side of a reward actor's replacement, with the real RolloutWorker and
scorer and in-process actor handles: while the judge generator or the reward model it was given
is dead, its episodes are infrastructure failures (the environment's reward kept, never a 0);
once handed the replacement (set_judge_generators / set_reward_model), it scores with it."""

from __future__ import annotations

import anyio
import pytest

from agentrl.engine.rewards.judge import JudgeSettings
from agentrl.engine.rewards.scoring import RewardSettings
from agentrl.engine.rewards.scoring_bundle import ScoringSettings
from agentrl.engine.testing import FakeRewardModel, ScriptedGenerator, local_actor
from agentrl.models.loading import load_tokenizer

ROW = {"question": "Compute 12*34+5.", "answer": "413"}
JUDGE = JudgeSettings(template="Q: {question}\nA: {response}\nScore 0-10:", timeout_s=5.0)


def _worker(model, tok, **kwargs):
    from agentrl.engine.episodes.rollout import RolloutWorker
    from agentrl.engine.episodes.runner import EpisodeSettings
    from agentrl.sandbox.testing import FakeSandbox

    policy = ScriptedGenerator(tok, lambda prompt, sampling: "\\boxed{413}")
    return RolloutWorker(
        episodes=EpisodeSettings(
            tokenizer=str(model), env_id="agentrl/Calc-v0", env_kwargs={"sandbox": FakeSandbox()}, sandbox_kind=None,
            sandbox_kwargs={}, sampling={}, max_new_tokens=16, max_episode_tokens=512, seed=0,
        ),
        generators=[policy], max_concurrent_episodes=8, generate_timeout_s=10, **kwargs,
    )


@pytest.mark.parametrize("which", ["judge", "reward_model"])
def test_a_dead_reward_actor_fails_the_episodes_in_words_and_its_replacement_scores_them(tiny_calc_model, which):
    tok = load_tokenizer(str(tiny_calc_model))

    def make():
        if which == "judge":
            return local_actor(ScriptedGenerator(tok, lambda prompt, sampling: "Score: 6"), "judge 0")
        return local_actor(FakeRewardModel(), "reward model")

    first = make()
    if which == "judge":
        worker = _worker(tiny_calc_model, tok, scoring=ScoringSettings(reward=RewardSettings(judge_weight=0.5), judge=JUDGE),
                         judge_generators=[first])
        part, scored = "judge_score", 1.0 + 0.5 * 0.6
    else:
        worker = _worker(tiny_calc_model, tok, scoring=ScoringSettings(reward=RewardSettings(rm_weight=2.0)), reward_model=first)
        part, scored = "rm_score", 1.0 + 2.0 * 0.5

    group = anyio.run(worker.run_group, ROW, 0, "p0", 2)
    assert [t.status for t in group] == ["ok", "ok"] and all(t.reward == pytest.approx(scored) for t in group)

    first.kill()
    group = anyio.run(worker.run_group, ROW, 1, "p1", 2)
    words = "judge: the generator failed: FakeActorDied" if which == "judge" else "reward model: the call failed: FakeActorDied"
    for t in group:
        assert t.status == "infra_failure" and not t.trainable
        assert t.info["reward_failure"] == which and t.info["error"].startswith(words), t.info["error"]
        assert t.reward == 1.0 and part not in t.metrics  # the environment's reward as it was: no 0 written

    new = make()
    if which == "judge":
        worker.set_judge_generators([new])
    else:
        worker.set_reward_model(new)
    group = anyio.run(worker.run_group, ROW, 2, "p2", 2)
    assert [t.status for t in group] == ["ok", "ok"] and all(t.reward == pytest.approx(scored) for t in group)
