"""The adapter reaches vLLM: after an adapter update, vLLM's log-probs equal the learner's (peft)
log-probs on the same tokens and differ from the base model's; a request in flight across an
update (part-way through when the update returns) finishes on the adapter it started with: its
tokens carry that version and that adapter's log-probs.

One vLLM engine (``VllmGenerator`` with LoRA, CPU: vLLM's PunicaWrapperCPU) and one learner
rank, in this process."""

from __future__ import annotations

import asyncio

import pytest

from tests.engine.generation.inflight import sampled_tokens, sampling_started
from tests.engine.training.test_learner_correctness import make_learner

TOL = 1e-4
LORA = {"rank": 8, "alpha": 32.0, "target_modules": "all-linear"}


def _samples(prompts, gens):
    return [
        {
            "tokens": p + g.token_ids, "loss_mask": [0] * len(p) + [1] * len(g.token_ids),
            "behaviour_logprobs": [0.0] * len(p) + g.logprobs, "advantage": 1.0,
            "versions": [-1] * len(p) + g.versions, "id": f"p{i}/0",
        }
        for i, (p, g) in enumerate(zip(prompts, gens))
    ]


def _diffs(samples, learner_lps):
    return [abs(a - b) for s, lp in zip(samples, learner_lps) for a, b, m in zip(lp, s["behaviour_logprobs"], s["loss_mask"]) if m]


def _adapter_logprobs(model: str, adapter: str, samples) -> list[list[float]]:
    """Each sample's log-probs under ``model`` with the peft adapter folder ``adapter`` alone
    (plain transformers + peft, float32), laid out like the learner's (0.0 at the first token)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from tests.engine.training.test_learner_correctness import reference_logprobs

    lm = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32), adapter).eval()
    with torch.no_grad():
        return [[0.0, *reference_logprobs(lm, s["tokens"]).tolist()] for s in samples]


@pytest.mark.vllm
def test_adapter_versions_reach_vllm_exactly_and_requests_keep_theirs(tiny_calc_model, tmp_path):
    check_adapters_reach_vllm(str(tiny_calc_model), tmp_path, lr=5e-3)


def check_adapters_reach_vllm(model: str, tmp_path, *, lr: float, long_tokens: int = 160) -> None:
    """The whole proof on ``model`` (also run on SmolLM2 by tests/e2e/test_smollm2_lora_e2e.py)."""
    from agentrl.engine.generation.generator import EngineSettings, VllmGenerator
    from agentrl.engine.training.lora import vllm_max_lora_rank
    from agentrl.models.loading import load_tokenizer

    tok = load_tokenizer(model)
    prompts = [tok(t)["input_ids"] for t in ["What is 123*45+67?", "Compute 908*12+3.", "17*34+5 ="]]
    learner = make_learner(model, lora=LORA, lr=lr, micro_batch_tokens=4096)
    settings = EngineSettings(
        model=model, dtype="float32", max_model_len=512, kv_cache_gib=0.1, seed=0,
        max_lora_rank=vllm_max_lora_rank(LORA["rank"]), max_loras=3,
    )
    gen = VllmGenerator(settings, timeout_s=120)
    sampling = {"max_tokens": 32, "temperature": 1.0, "seed": 0, "ignore_eos": True}

    async def scenario():
        await gen.start()
        base = [await gen.generate(p, sampling) for p in prompts]
        assert all(v == 0 for g in base for v in g.versions)
        # a few steps move the adapter away from zero (B starts at 0)
        for _ in range(3):
            learner.train_step(_samples(prompts, base))
        v1 = learner.publish(str(tmp_path / "v1"))
        # a long request starts on version 0 (the base model) and spans the update: it has sampled
        # some of its tokens when the update starts, and not all of them when it has returned
        long_task = asyncio.ensure_future(gen.generate(prompts[0], {**sampling, "max_tokens": long_tokens, "seed": 1}))
        await sampling_started(gen)
        t0 = asyncio.get_running_loop().time()
        out["stall"] = await gen.update_weights(1, v1)
        out["update_wall"] = asyncio.get_running_loop().time() - t0
        out["long_at_update"] = (long_task.done(), sampled_tokens(gen))
        out["loaded"] = set(gen.adapters)
        new = [await gen.generate(p, sampling) for p in prompts]
        long = await long_task
        # the learner holds exactly version 1 now: its (peft) view of the same tokens
        out["new"], out["long"] = _samples(prompts, new), _samples(prompts[:1], [long])
        out["mine"] = learner.compute_logprobs(out["new"])
        with learner.peft.disable_adapter():
            out["base_view"] = learner.compute_logprobs(out["new"])
            out["long_base"] = learner.compute_logprobs(out["long"])
        # version 2 while a version-1 request is in flight: version 1 is unloaded once it ends
        for _ in range(2):
            learner.train_step(out["new"])
        v2 = learner.publish(str(tmp_path / "v2"))
        inflight = asyncio.ensure_future(gen.generate(prompts[1], {**sampling, "max_tokens": 96}))
        await sampling_started(gen)
        await gen.update_weights(2, v2)
        out["v1_at_update"] = (inflight.done(), sampled_tokens(gen))
        out["still"] = set(gen.adapters)
        out["on_v1"] = await inflight
        out["on_v1_sample"] = _samples(prompts[1:2], [out["on_v1"]])
        out["on_v1_v2_view"] = learner.compute_logprobs(out["on_v1_sample"])  # the learner holds version 2 now
        out["after"] = set(gen.adapters)
        out["listed"] = await gen.engine.list_loras()
        out["v2_id"] = gen.adapters[2].lora_int_id
        # a new request takes version 2 (the learner holds it)
        out["on_v2"] = _samples(prompts[2:], [await gen.generate(prompts[2], sampling)])
        out["on_v2_mine"] = learner.compute_logprobs(out["on_v2"])
        await gen.shutdown()

    out: dict = {}
    try:
        asyncio.run(scenario())
    finally:
        learner.shutdown()
    assert all(v == 1 for s in out["new"] for v, m in zip(s["versions"], s["loss_mask"]) if m)
    long = out["long"][0]
    assert sum(long["loss_mask"]) == long_tokens and {v for v, m in zip(long["versions"], long["loss_mask"]) if m} == {0}
    # the long request was in flight across the update: part-way through when it returned
    done, progress = out["long_at_update"]
    print(f"the version-0 request had sampled {progress} of {long_tokens} tokens when the update returned")
    assert not done and len(progress) == 1 and 0 < progress[0] < long_tokens
    # the stall is the time the update took (with LoRA nothing is paused: loading the adapter)
    assert 1 in out["loaded"] and 0.0 < out["stall"] <= out["update_wall"]
    # the adapter reached vLLM: its log-probs are the learner's (peft) ones, not the base model's
    diffs = _diffs(out["new"], out["mine"])
    print(f"vLLM adapter v1 vs peft over {len(diffs)} tokens: max |dlogp| {max(diffs):.3g}, mean {sum(diffs) / len(diffs):.3g}")
    assert len(diffs) == 3 * 32 and max(diffs) < TOL
    assert max(_diffs(out["new"], out["base_view"])) > 100 * TOL
    # the request that spanned the update was the base model's throughout
    assert max(_diffs(out["long"], out["long_base"])) < TOL
    # the version-1 request in flight across the version-2 update kept its adapter: labels, and
    # log-probs of version 1's adapter alone (not version 2's); version 1 was unloaded after it
    done, progress = out["v1_at_update"]
    assert not done and len(progress) == 1 and 0 < progress[0] < 96, progress
    assert set(out["on_v1"].versions) == {1}
    v1_ref = _adapter_logprobs(model, str(tmp_path / "v1"), out["on_v1_sample"])
    v1_diffs, v2_diffs = _diffs(out["on_v1_sample"], v1_ref), _diffs(out["on_v1_sample"], out["on_v1_v2_view"])
    print(f"version-1 request across the update, max |dlogp| against adapter v1 {max(v1_diffs):.3g}, against v2 {max(v2_diffs):.3g}")
    assert len(v1_diffs) == 96 and max(v1_diffs) < TOL
    assert max(v2_diffs) > 10 * TOL  # two small steps apart (SmolLM2 at lr 1e-3: 8e-3)
    # a new request after it has version 2's adapter: its label, the learner's log-probs now
    assert {v for v, m in zip(out["on_v2"][0]["versions"], out["on_v2"][0]["loss_mask"]) if m} == {2}
    assert max(_diffs(out["on_v2"], out["on_v2_mine"])) < TOL
    assert out["still"] >= {1, 2} and out["after"] == {2} and set(out["listed"]) == {out["v2_id"]}
