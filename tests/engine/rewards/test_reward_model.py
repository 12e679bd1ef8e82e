"""The reward model's server with a real (tiny, randomly headed) sequence classifier: concurrent
requests share forward passes and score exactly as one by one."""

from __future__ import annotations

import asyncio
import json
import shutil
import time

import pytest

from agentrl.engine.rewards.reward_model import RewardModelServer, render_item
from agentrl.errors import RewardModelError

CONVERSATIONS = [
    [{"role": "user", "content": f"Compute {a}*{b}+1."}, {"role": "assistant", "content": f"\\boxed{{{a * b + 1}}}"}]
    for a, b in [(3, 4), (12, 34), (5, 5), (908, 12), (1, 1), (77, 3), (40, 40)]
] + ["a plain text, scored as is"]


def test_concurrent_requests_are_batched_and_score_as_one_by_one(tiny_calc_model):
    server = RewardModelServer(str(tiny_calc_model), max_batch_size=4, max_wait_ms=50, seed=0)
    alone = [server.score_now([item])[0] for item in CONVERSATIONS]
    server.forwards = 0

    async def main():
        return await asyncio.wait_for(asyncio.gather(*[server.score([item]) for item in CONVERSATIONS]), 60)

    batched = [s for (s,) in asyncio.run(main())]
    assert batched == pytest.approx(alone, abs=1e-5)  # padding changes nothing
    assert len({round(x, 6) for x in alone}) == len(CONVERSATIONS)  # the (random) head tells every item apart
    assert server.forwards == 2  # 8 requests, batches of 4
    assert server.stats()["items"] == 8 and server.stats()["requests"] == 8


def test_same_seed_same_head(tiny_calc_model):
    a = RewardModelServer(str(tiny_calc_model), seed=1).score_now(CONVERSATIONS[:2])
    b = RewardModelServer(str(tiny_calc_model), seed=1).score_now(CONVERSATIONS[:2])
    assert a == b


def test_pads_with_eos_when_the_tokenizer_has_no_pad_token(tiny_calc_model, tmp_path):
    folder = tmp_path / "no-pad"
    shutil.copytree(tiny_calc_model, folder)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["pad_token"] = None
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    model_cfg = json.loads((folder / "config.json").read_text())
    model_cfg["pad_token_id"] = None
    (folder / "config.json").write_text(json.dumps(model_cfg))
    server = RewardModelServer(str(folder), seed=0)
    assert server.tokenizer.pad_token == server.tokenizer.eos_token
    assert server.model.config.pad_token_id == server.tokenizer.eos_token_id
    two = server.score_now(CONVERSATIONS[:2])
    assert two == pytest.approx([server.score_now([c])[0] for c in CONVERSATIONS[:2]], abs=1e-5)


def test_a_failing_forward_fails_each_request_of_the_batch_in_words(tiny_calc_model):
    server = RewardModelServer(str(tiny_calc_model), max_batch_size=8, max_wait_ms=20)

    async def main():
        return await asyncio.gather(server.score([CONVERSATIONS[0]]), server.score([[{"no role": 1}]]), return_exceptions=True)

    results = asyncio.run(main())
    assert all(isinstance(r, RewardModelError) for r in results), results
    assert str(results[0]).startswith("reward model: the forward pass failed: ")


def test_render_item_uses_the_chat_template(tiny_calc_model):
    from agentrl.models.loading import load_tokenizer

    tok = load_tokenizer(str(tiny_calc_model))
    text = render_item(tok, CONVERSATIONS[0])
    assert text.startswith("<|im_start|>user\nCompute 3*4+1.") and "<|im_start|>assistant\n\\boxed{13}" in text
    assert render_item(tok, "as is") == "as is"


def test_the_scorer_asks_the_server_through_an_actor_handle(tiny_calc_model):
    """The rollout worker's path: ``handle.score.remote([conversation])`` per episode."""
    import anyio

    from agentrl.engine.rewards.scoring import EpisodeScorer, RewardSettings
    from agentrl.engine.testing import local_actor
    from agentrl.engine.common.trajectory import Trajectory
    from agentrl.models.loading import load_tokenizer

    tok = load_tokenizer(str(tiny_calc_model))
    server = RewardModelServer(str(tiny_calc_model), seed=0)
    prompt = tok.encode("<|im_start|>user\nCompute 3*4+1.<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    said = tok.encode("\\boxed{13}<|im_end|>", add_special_tokens=False)
    n = len(prompt) + len(said)
    t = Trajectory(tokens=prompt + said, loss_mask=[0] * len(prompt) + [1] * len(said), behaviour_logprobs=[0.0] * n,
                   versions=[-1] * n, reward=1.0, group_id="g", sample_index=0, prompt_index=0)
    scorer = EpisodeScorer(RewardSettings(rm_weight=0.5), tokenizer=tok, reward_model=local_actor(server))
    anyio.run(scorer.score, t, {"question": "Compute 3*4+1."})
    expected = server.score_now([CONVERSATIONS[0]])[0]
    assert t.metrics["rm_score"] == pytest.approx(expected, abs=1e-6)
    assert t.reward == pytest.approx(1.0 + 0.5 * expected)


@pytest.mark.ray
def test_the_reward_model_runs_as_a_ray_actor_and_batches_concurrent_episodes(tiny_calc_model, tmp_path, ray_local):
    """The run's path for real: the server started by ``start_reward_actors`` as a Ray actor from
    the recipe's wiring, episodes scored concurrently through its handle, batched in the actor.

    A batch goes as soon as ``max_batch_size`` items wait; ``max_wait_ms`` is long, so that the 8
    requests sent at once share one forward pass however slowly Ray delivers them here."""
    import ray

    from agentrl.config import validate_recipe
    from agentrl.engine import wiring
    from agentrl.engine.rewards.reward_actors import start_reward_actors

    class Log:
        def event(self, message: str, **_: object) -> None:
            pass

    recipe = validate_recipe({"model": {"path": str(tiny_calc_model)},
                              "reward": {"model": {"path": str(tiny_calc_model), "weight": 1.0, "max_batch_size": 8, "max_wait_ms": 30_000}}})
    spec = wiring.reward_model_actor(recipe, tmp_path)
    spec.options["num_cpus"] = 0

    async def main():
        actors = await start_reward_actors([], spec, startup_timeout_s=120, log=Log())
        handle = actors.reward_model
        try:
            t0 = time.monotonic()
            scores = await asyncio.wait_for(asyncio.gather(*[handle.score.remote([item]) for item in CONVERSATIONS]), 120)
            return [s for (s,) in scores], await handle.stats.remote(), time.monotonic() - t0
        finally:
            ray.kill(handle)  # the session's local Ray (tests/conftest.py) goes on to the next test

    scores, stats, elapsed = asyncio.run(main())
    alone = RewardModelServer(str(tiny_calc_model), seed=recipe.seed).score_now(CONVERSATIONS)
    assert scores == pytest.approx(alone, abs=1e-5)
    # the 8 concurrent episodes were scored in one forward pass of 8 items, sent once the batch was
    # full (not after max_wait_ms)
    assert (stats["requests"], stats["items"], stats["forwards"]) == (8, 8, 1), stats
    assert elapsed < 15, elapsed
