"""LoRA in the learner (peft under FSDP2), the adapter folder, merging and export; no vLLM here
(tests/engine/training/test_lora_vllm.py proves the adapter reaches vLLM)."""

from __future__ import annotations

import json

import pytest
import torch

from agentrl.algos import ObjectiveSettings
from agentrl.engine.training.lora import LoraSettings, is_adapter_folder, merge_lora
from agentrl.errors import ConfigError
from tests.engine.training.test_learner_correctness import make_learner

LORA = {"rank": 8, "alpha": 16.0, "target_modules": ["q_proj", "v_proj", "up_proj"]}


def samples(n: int = 4) -> list[dict]:
    out = []
    for i in range(n):
        toks = [5 + i, 9, 12 + i, 7, 30, 31 + i, 8, 40]
        out.append({
            "tokens": toks, "loss_mask": [0, 0, 0] + [1] * 5, "behaviour_logprobs": [0.0] * 3 + [-3.0] * 5,
            "advantage": 1.0 if i % 2 else -1.0, "versions": [-1] * 3 + [0] * 5, "id": f"p{i}/0",
        })
    return out


def test_only_the_adapter_trains_and_the_reference_is_the_base_model(tiny_calc_model, tmp_path):
    learner = make_learner(str(tiny_calc_model), lora=LORA, objective=ObjectiveSettings(kl_coef=0.1))
    try:
        trainable = [n for n, p in learner.policy.named_parameters() if p.requires_grad]
        assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable), trainable
        opt_params = [p for g in learner.optimizer.param_groups for p in g["params"]]
        assert {id(p) for p in opt_params} == {id(p) for n, p in learner.policy.named_parameters() if p.requires_grad}
        assert learner.reference is not None and learner.reference.policy is learner.policy  # no second model
        before = {k: v.clone() for k, v in learner.full_state_dict().items()}
        base_lp = learner.compute_logprobs(samples())
        metrics = learner.train_step(samples())
        assert metrics["trained_tokens"] > 0
        after = learner.full_state_dict()
        changed = sorted(k for k in before if not torch.equal(before[k], after[k]))
        assert changed and all(".lora_B." in k or ".lora_A." in k for k in changed), changed
        # the reference (adapter off) still computes the base model's log-probs
        batch_lp = learner.compute_logprobs(samples())
        assert any(abs(a - b) > 1e-6 for x, y in zip(base_lp, batch_lp) for a, b in zip(x, y))
        with learner.peft.disable_adapter():
            off = learner.compute_logprobs(samples())
        assert all(abs(a - b) < 1e-6 for x, y in zip(base_lp, off) for a, b in zip(x, y))
        # the published version is the adapter alone, in peft's format
        out = learner.publish(str(tmp_path / "v1"))
        assert is_adapter_folder(out)
        cfg = json.loads((tmp_path / "v1" / "adapter_config.json").read_text())
        assert cfg["r"] == 8 and sorted(cfg["target_modules"]) == ["q_proj", "up_proj", "v_proj"]
        from safetensors.torch import load_file

        tensors = load_file(str(tmp_path / "v1" / "adapter_model.safetensors"))
        assert tensors and all(k.startswith("base_model.model.") and (".lora_A." in k or ".lora_B." in k) for k in tensors)
        # merged: a plain model whose log-probs are the adapted policy's
        merged = learner.publish(str(tmp_path / "merged"), merged=True)
    finally:
        learner.shutdown()
    from transformers import AutoModelForCausalLM

    from agentrl.engine.training.logprobs import PolicyModel

    model = AutoModelForCausalLM.from_pretrained(merged, torch_dtype=torch.float32)
    assert not any("lora" in k for k in model.state_dict())
    s = samples()[0]
    ids = torch.tensor([s["tokens"]])
    lp, _ = PolicyModel(model)(ids, torch.ones_like(ids), torch.ones(1, len(s["tokens"]) - 1, dtype=torch.bool))
    # compute_logprobs gives the trained (mask 1) positions: tokens 3.. here
    assert torch.allclose(lp[2:], torch.tensor(batch_lp[0][3:], dtype=lp.dtype), atol=1e-5)
    # peft loads the adapter folder on the base model with the same result
    from peft import PeftModel

    base = AutoModelForCausalLM.from_pretrained(str(tiny_calc_model), torch_dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(base, str(tmp_path / "v1"))
    lp2, _ = PolicyModel(peft_model.base_model.model)(ids, torch.ones_like(ids), torch.ones(1, len(s["tokens"]) - 1, dtype=torch.bool))
    assert torch.allclose(lp2, lp, atol=1e-5)


def test_a_target_module_the_model_lacks_is_a_config_error(tiny_calc_model):
    with pytest.raises(ConfigError, match=r"lora.target_modules: \['qkv_fused'\] match no module.*q_proj"):
        make_learner(str(tiny_calc_model), lora={"rank": 4, "target_modules": ["qkv_fused"]})


def test_merge_lora_adds_the_scaled_update():
    a, b, w = torch.randn(2, 3), torch.randn(4, 2), torch.randn(4, 3)
    state = {
        "m.q.base_layer.weight": w, "m.q.base_layer.bias": torch.ones(4),
        "m.q.lora_A.default.weight": a, "m.q.lora_B.default.weight": b, "m.norm.weight": torch.ones(3),
    }
    out = merge_lora(state, scaling=LoraSettings(rank=2, alpha=4.0).scaling)
    assert sorted(out) == ["m.norm.weight", "m.q.bias", "m.q.weight"]
    assert torch.allclose(out["m.q.weight"], w + 2.0 * b @ a)


def test_merge_lora_takes_saved_modules_whole():
    state = {
        "lm_head.original_module.weight": torch.zeros(3, 2),
        "lm_head.modules_to_save.default.weight": torch.ones(3, 2),
        "model.norm.weight": torch.ones(2),
    }
    out = merge_lora(state, scaling=1.0)
    assert sorted(out) == ["lm_head.weight", "model.norm.weight"]
    assert torch.equal(out["lm_head.weight"], torch.ones(3, 2))


def test_lora_sft_steps_train_the_adapter_only(tiny_calc_model):
    learner = make_learner(str(tiny_calc_model), lora={"rank": 4, "target_modules": ["q_proj"]}, lr=1e-2)
    try:
        before = learner.full_state_dict()
        batch = [{"tokens": [5, 9, 12, 7, 30, 31], "loss_mask": [0, 0, 1, 1, 1, 1]}] * 2
        for _ in range(2):
            learner.sft_step(batch)
        after = learner.full_state_dict()
    finally:
        learner.shutdown()
    changed = sorted(k for k in before if not torch.equal(before[k], after[k]))
    assert changed and all(".q_proj.lora_" in k for k in changed), changed


def _lora_rank_main(rank: int, model: str, port: int, out: str, batches: list) -> None:
    from agentrl.engine.training.learner import Learner

    learner = Learner(rank=rank, world_size=2, master_addr="127.0.0.1", master_port=port, model=model, seed=0, lora=LORA, **LORA_OPTS)
    learner.setup()
    try:
        for b in batches:
            learner.train_step(b)
        learner.publish(f"{out}/adapter")
        learner.save_checkpoint(f"{out}/ckpt")
    finally:
        learner.shutdown()


LORA_OPTS = dict(lr=1e-2, adam_eps=1e-8, grad_clip=1.0, micro_batch_tokens=64, logprob_chunk_tokens=16, torch_threads=1)


def test_two_lora_ranks_match_one_rank_and_checkpoints_export(tiny_calc_model, tmp_path):
    """FSDP2 over two ranks trains the same adapter as one rank; the sharded checkpoint exports
    (one process) to that adapter and to a merged model."""
    from safetensors.torch import load_file

    from agentrl.engine.training.checkpoint import export_checkpoint
    from tests.engine.training.ranks import run_ranks
    from tests.engine.training.test_learner_correctness import free_port, make_samples

    batches = [make_samples(3, seed=20, min_len=40, max_len=60), make_samples(9, seed=21, min_len=6, max_len=40)]
    port = free_port()
    run_ranks(_lora_rank_main, lambda r: (r, str(tiny_calc_model), port, str(tmp_path), batches), timeout_s=180)
    two = load_file(str(tmp_path / "adapter" / "adapter_model.safetensors"))

    one = make_learner(str(tiny_calc_model), lora=LORA, **LORA_OPTS)
    try:
        for b in batches:
            one.train_step(b)
        one.publish(str(tmp_path / "one"))
    finally:
        one.shutdown()
    ref = load_file(str(tmp_path / "one" / "adapter_model.safetensors"))
    assert sorted(two) == sorted(ref)
    worst = max(float((two[k] - ref[k]).abs().max()) for k in ref)
    assert worst < 1e-5, worst
    assert any(float(ref[k].abs().max()) > 1e-4 for k in ref if ".lora_B." in k)  # it trained
    exported = load_file(str(export_checkpoint(tmp_path / "ckpt", tmp_path / "exported") / "adapter_model.safetensors"))
    assert max(float((exported[k] - ref[k]).abs().max()) for k in ref) < 1e-5
    merged = export_checkpoint(tmp_path / "ckpt", tmp_path / "merged", merge=True)
    assert (merged / "model.safetensors").is_file() and not any("lora" in k for k in load_file(str(merged / "model.safetensors")))
