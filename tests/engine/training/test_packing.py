"""Packed micro-batches (``learner.pack_microbatches``): samples laid end to end in one row, no
padding, positions restarting per sample. They must give the loss and the gradients of padded
micro-batches: the plan, the batch's layout, the policy's log-probs and gradients, and a learner
step through FSDP2, each against the padded path."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from agentrl.engine.training.logprobs import PolicyModel
from agentrl.engine.training.microbatch import packs_microbatches, plan_microbatches
from agentrl.engine.training.padded import PaddedBatch
from tests.engine.training.test_learner_correctness import make_learner, make_samples, max_diff, one_step


def rows(lengths: list[int], seed: int = 0, vocab: int = 200) -> list[dict[str, Any]]:
    """Rows of these lengths: a 3-token prompt (mask 0), then trained tokens (mask 1)."""
    rng = random.Random(seed)
    return [{"tokens": [rng.randrange(3, vocab) for _ in range(n)], "loss_mask": [0] * 3 + [1] * (n - 3)} for n in lengths]


def test_a_packed_plan_budgets_the_samples_tokens_not_their_padded_slots():
    lengths = [40, 9, 9, 8, 3]
    padded = plan_microbatches(lengths, token_budget=40, world_size=1)
    packed = plan_microbatches(lengths, token_budget=40, world_size=1, packed=True)
    assert sorted(i for mb in packed for i in mb) == list(range(5))
    assert all(sum(lengths[i] for i in mb) <= 40 for mb in packed)
    assert len(packed) == 2  # [40] and the four short ones (29 tokens): padded they would cost 36 slots at least
    assert len(packed) <= len(padded)


def test_a_packed_batch_restarts_positions_and_never_trains_across_a_boundary():
    rs = rows([5, 4, 6])
    padded = PaddedBatch(rs, pad_id=0, device=torch.device("cpu"))
    packed = PaddedBatch(rs, pad_id=0, device=torch.device("cpu"), packed=True)
    assert packed.ids.tolist() == [[t for r in rs for t in r["tokens"]]]
    assert packed.attn is None and padded.position_ids is None
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 3, 0, 1, 2, 3, 4, 5]]
    assert packed.model_select.shape == (1, 14)
    # the last token of a row never predicts the next row's first: positions 4 and 8 are boundaries
    assert not packed.model_select[0, 4] and not packed.model_select[0, 8]
    # the same targets, in the same order: the selected next-tokens agree
    want = padded.ids[:, 1:][padded.select]
    assert torch.equal(packed.ids[:, 1:][packed.model_select], want)
    assert packed.slots == packed.real_tokens == 15 and padded.slots == 18


def tiny_llama(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=200, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    config._attn_implementation = "sdpa"
    return AutoModelForCausalLM.from_config(config).float()


def loss_and_grads(policy: PolicyModel, batch: PaddedBatch, weights: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    policy.zero_grad()
    flat, _ = policy(batch.ids, batch.attn, batch.model_select, 7, False, batch.position_ids)
    lp = batch.pad(flat)  # the loss's [B, T-1] layout either way
    loss = -(lp * weights).sum() / batch.select.sum()
    loss.backward()
    return loss.detach(), {n: p.grad.detach().clone() for n, p in policy.named_parameters()}


def test_packed_and_padded_give_the_same_log_probs_loss_and_gradients():
    rs = rows([12, 5, 9, 3, 7], seed=1)
    policy = PolicyModel(tiny_llama())
    padded = PaddedBatch(rs, pad_id=0, device=torch.device("cpu"))
    packed = PaddedBatch(rs, pad_id=0, device=torch.device("cpu"), packed=True)
    weights = torch.randn(padded.select.shape, generator=torch.Generator().manual_seed(2)) * padded.select
    loss_pad, grads_pad = loss_and_grads(policy, padded, weights)
    loss_pack, grads_pack = loss_and_grads(policy, packed, weights)
    assert float((loss_pack - loss_pad).abs()) < 1e-6, (loss_pack, loss_pad)
    assert max(float((grads_pack[n] - grads_pad[n]).abs().max()) for n in grads_pad) < 1e-5
    # without the restarted positions the packed row would attend across samples: different log-probs
    with torch.no_grad():
        leaked, _ = policy(packed.ids, None, packed.model_select, 7, False, None)
        honest, _ = policy(packed.ids, None, packed.model_select, 7, False, packed.position_ids)
    assert float((leaked - honest).abs().max()) > 1e-3


@pytest.mark.parametrize(("setting", "impl", "want"), [
    ("auto", "sdpa", False), ("auto", "eager", False), ("auto", None, False), ("auto", "flash_attention_2", True),
    ("on", "sdpa", True), ("off", "flash_attention_2", False),
])
def test_auto_packs_under_flash_attention_only(setting, impl, want):
    assert packs_microbatches(setting, impl) is want


def test_an_unknown_packing_setting_is_refused():
    with pytest.raises(ValueError, match="pack_microbatches"):
        packs_microbatches("yes", "sdpa")


def test_a_packed_learner_step_gives_the_padded_update(tiny_calc_model):
    """Through the learner (one FSDP2 rank): the same metrics and the same parameters after an
    RL step, packed or padded; packed has no padding and no more micro-batches."""
    samples = make_samples(7, seed=4)
    padded, before = one_step(str(tiny_calc_model), samples, lambda ln: _is(ln.packed, False), pack_microbatches="off")
    packed, after = one_step(str(tiny_calc_model), samples, lambda ln: _is(ln.packed, True), pack_microbatches="on")
    assert packed["loss"] == pytest.approx(padded["loss"], abs=1e-6)
    assert packed["entropy"] == pytest.approx(padded["entropy"], abs=1e-5)
    assert packed["trained_tokens"] == padded["trained_tokens"]
    assert packed["padding_fraction"] == 0.0 and padded["padding_fraction"] > 0.0
    assert max_diff(before, after) < 1e-6


def _is(value: object, want: object) -> None:
    assert value is want, (value, want)


def test_the_recipes_attention_implementation_reaches_the_learner(tiny_calc_model, tmp_path):
    """``model.attn_implementation`` goes through wiring into the learner's model: eager here, and
    auto does not pack under it; a value transformers does not offer is refused by the recipe."""
    from agentrl.config import load_recipe
    from agentrl.engine import wiring
    from agentrl.errors import ConfigError

    recipe_file = tmp_path / "r.toml"
    recipe_file.write_text(f'[model]\npath = "{tiny_calc_model}"\nattn_implementation = "eager"\n')
    kwargs = wiring.learner_kwargs(load_recipe(recipe_file), model=str(tiny_calc_model), tokenizer=None, run_dir=tmp_path)
    assert kwargs["attn_implementation"] == "eager" and kwargs["pack_microbatches"] == "auto"
    learner = make_learner(str(tiny_calc_model), attn_implementation="eager")
    try:
        assert learner.config._attn_implementation == "eager" and learner.packed is False
    finally:
        learner.shutdown()
    recipe_file.write_text(f'[model]\npath = "{tiny_calc_model}"\nattn_implementation = "fast"\n')
    with pytest.raises(ConfigError, match="model.attn_implementation: got 'fast'"):
        load_recipe(recipe_file)
