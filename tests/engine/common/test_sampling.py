"""The run's sampling (agentrl.engine.common.sampling): read once in wiring, the same value reaches
the learner (its temperature) and the rollout workers (what their generators sample with)."""

from __future__ import annotations

import anyio
import pytest

from agentrl.config import validate_recipe
from agentrl.engine import wiring
from agentrl.engine.common.interfaces import Generation
from agentrl.engine.common.sampling import Sampling
from agentrl.errors import ConfigError
from agentrl.sandbox.testing import FakeSandbox


def test_one_sampling_reaches_the_learner_and_the_rollout_workers(tmp_path):
    r = validate_recipe({"model": {"path": "unused"}, "rollout": {"temperature": 0.7, "top_p": 0.9, "stop": ["</x>"]}})
    sampling = wiring.worker_kwargs(r, tokenizer="/t", run_dir=tmp_path)["episodes"].sampling
    assert sampling == wiring.rollout_sampling(r) == Sampling(temperature=0.7, top_p=0.9, stop=("</x>",))
    assert wiring.learner_kwargs(r, model="/m", tokenizer=None, run_dir=tmp_path)["temperature"] == sampling.temperature
    assert sampling.params() == {"temperature": 0.7, "top_p": 0.9, "stop": ["</x>"]}


def test_sampling_refuses_what_the_learner_cannot_match():
    with pytest.raises(ConfigError, match="temperature must be positive"):
        Sampling(temperature=0.0)
    with pytest.raises(ConfigError, match="top_p must be in"):
        Sampling(top_p=0.0)
    with pytest.raises(ConfigError, match="stop must be a sequence of strings"):
        Sampling(stop="</x>")  # type: ignore[arg-type]


def test_a_rollout_worker_given_the_sampling_generates_with_it(tiny_calc_model):
    from agentrl.engine.episodes.rollout import RolloutWorker
    from agentrl.engine.episodes.runner import EpisodeSettings
    from agentrl.models.loading import load_tokenizer

    tok = load_tokenizer(str(tiny_calc_model))

    class RecordingGen:
        def __init__(self) -> None:
            self.params: list[dict] = []

        async def generate(self, ids, params):
            self.params.append(dict(params))
            out = tok.encode("\\boxed{413}<|im_end|>", add_special_tokens=False)
            return Generation(out, [-0.1] * len(out), [0] * len(out), "stop")

    gen = RecordingGen()
    worker = RolloutWorker(
        episodes=EpisodeSettings(
            tokenizer=str(tiny_calc_model), env_id="agentrl/Calc-v0", env_kwargs={"sandbox": FakeSandbox()},
            sandbox_kind=None, sandbox_kwargs={}, sampling=Sampling(temperature=0.7, top_p=0.9),
            max_new_tokens=16, max_episode_tokens=512, seed=0,
        ),
        generators=[gen], max_concurrent_episodes=2, generate_timeout_s=10,
    )
    anyio.run(worker.run_group, {"question": "Compute 12*34+5.", "answer": "413"}, 0, "g", 2)
    assert len(gen.params) == 2
    assert all((p["temperature"], p["top_p"]) == (0.7, 0.9) for p in gen.params)
