"""The LLM judge for real: the policy's own vLLM generator plays Calc episodes and then judges
them (``judge.model = "policy"``), through the rollout worker.

The tiny test model was never taught to grade, so (1) with vLLM structured outputs constraining
its answer to ``Score: [0-9]`` every episode gets a parsable score, and (2) left free, whatever it
writes either parses or is reported as a judge failure in words (``infra_failure``, never a 0).
"""

from __future__ import annotations

import re

import anyio
import pytest

from agentrl.engine.rewards.judge import JudgeSettings
from agentrl.engine.rewards.scoring import RewardSettings
from agentrl.sandbox.testing import FakeSandbox

ROW = {"question": "Compute 12*34+5.", "answer": "413"}
TEMPLATE = "Grade this answer to '{question}' (reference {answer}) from 0 to 9.\nAnswer: {response}\n"


@pytest.mark.vllm
def test_the_policy_generator_judges_its_own_episodes(tiny_calc_model):
    from agentrl.engine.generation.generator import EngineSettings, VllmGenerator
    from agentrl.engine.episodes.rollout import RolloutWorker
    from agentrl.engine.episodes.runner import EpisodeSettings
    from agentrl.engine.rewards.scoring_bundle import ScoringSettings

    async def main() -> None:
        gen = VllmGenerator(EngineSettings(model=str(tiny_calc_model), max_model_len=512, kv_cache_gib=0.05), timeout_s=120)
        await gen.start()
        try:
            def worker(judge: JudgeSettings) -> RolloutWorker:
                return RolloutWorker(
                    episodes=EpisodeSettings(
                        tokenizer=str(tiny_calc_model), env_id="agentrl/Calc-v0", env_kwargs={"sandbox": FakeSandbox(), "max_turns": 2},
                        sandbox_kind=None, sandbox_kwargs={}, sampling={"temperature": 1.0, "stop": ["</code>"]},
                        max_new_tokens=24, max_episode_tokens=256, seed=0,
                    ),
                    scoring=ScoringSettings(reward=RewardSettings(env_weight=1.0, judge_weight=0.1), judge=judge),
                    generators=[gen], max_concurrent_episodes=8, generate_timeout_s=120,
                )

            # (1) constrained: always a score
            constrained = JudgeSettings(template=TEMPLATE, score_max=9, max_tokens=8, timeout_s=120, output_regex="Score: [0-9]")
            group = await worker(constrained).run_group(ROW, 0, "g0", 3)
            assert [t.status for t in group if t.status == "infra_failure"] == [], [t.info.get("error") for t in group]
            for t in group:
                assert re.fullmatch(r"Score: [0-9]", t.info["judge_answer"]), t.info["judge_answer"]
                assert 0.0 <= t.metrics["judge_score"] <= 1.0
                assert t.reward == pytest.approx(t.metrics["env_reward"] + 0.1 * t.metrics["judge_score"])

            # (2) free text: a score, or a judge failure said in words and kept out of the loss
            free = JudgeSettings(template=TEMPLATE, score_max=9, max_tokens=16, timeout_s=120)
            group = await worker(free).run_group(ROW, 1, "g1", 3)
            for t in group:
                if t.status == "infra_failure":
                    assert t.info["reward_failure"] == "judge" and t.info["error"].startswith("judge: no score in its answer")
                    assert not t.trainable
                else:
                    assert 0.0 <= t.metrics["judge_score"] <= 1.0
        finally:
            await gen.shutdown()

    anyio.run(main)
