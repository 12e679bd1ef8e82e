"""Shared prefixes (``learner.shared_prefixes``): the samples of a group run their common prompt
once per micro-batch. The units, the row layout and its mask, and then what matters: the log-probs,
the loss and the gradients equal the padded path's (sdpa and eager), through the policy and
through a learner step under FSDP2, with fewer tokens computed."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from agentrl.engine.training.logprobs import PolicyModel
from agentrl.engine.training.padded import PaddedBatch
from agentrl.errors import ConfigError
from agentrl.engine.training.shared_prefix import SharedRows, Sharing, Unit, key_cost, shares_prefixes, units_of
from tests.engine.training.test_learner_correctness import make_learner, max_diff, one_step
from tests.engine.training.test_packing import tiny_llama


def groups(sizes: list[int], prompt: int = 6, seed: int = 0, vocab: int = 200) -> list[dict[str, Any]]:
    """Rows in groups of ``sizes``: each group one random prompt of ``prompt`` tokens (mask 0),
    then each row's own completion (mask 1) of 3..12 tokens; in every group of 3 or more, two
    completions begin with the same two tokens (the common prefix runs past the prompt), and the
    last row of a group of 4 is a prefix of another (the shared part stops one token short)."""
    rng = random.Random(seed)
    out = []
    for size in sizes:
        head = [rng.randrange(3, vocab) for _ in range(prompt)]
        tails = [[rng.randrange(3, vocab) for _ in range(rng.randint(3, 12))] for _ in range(size)]
        if size >= 3:
            tails[1][:2] = tails[0][:2]
        if size >= 4:
            tails[3] = tails[2][: max(1, len(tails[2]) // 2)]
        for tail in tails:
            out.append({"tokens": head + tail, "loss_mask": [0] * prompt + [1] * len(tail)})
    return out


def test_units_are_the_samples_of_one_prompt_sharing_their_longest_common_prefix():
    rs = groups([4, 1, 3], seed=1)
    tokens, masks = [r["tokens"] for r in rs], [r["loss_mask"] for r in rs]
    units = units_of(tokens, masks)
    assert [u.rows for u in units] == [[0, 1, 2, 3], [4], [5, 6, 7]]
    assert units[0].prefix == 6  # the prompt: rows 0 and 2 part at their first generated token
    assert units[1].prefix == len(tokens[4]) - 1  # alone: all but its last token
    assert units[2].prefix == 6
    # rows 5 and 6 alone share two more tokens; a row that is another's prefix keeps one token of its own
    pair = units_of(tokens[5:7], masks[5:7])
    assert pair[0].prefix == 8
    prefix_row = units_of([[1, 2, 3, 4], [1, 2, 3, 4, 5]], [[0, 0, 1, 1], [0, 0, 1, 1, 1]])
    assert prefix_row == [Unit([0, 1], 3)]
    # a budget cuts a unit, in order, and every cut keeps its own prefix
    lengths = [len(t) for t in tokens]
    cut = units_of(tokens, masks, budget=units[0].length(lengths) - 1)
    assert [u.rows for u in cut][:2] == [[0, 1, 2], [3]]
    assert all(u.length(lengths) <= units[0].length(lengths) - 1 for u in cut if len(u.rows) > 1)


def test_long_rows_with_a_short_shared_prompt_stay_apart_when_their_attention_would_cost_more():
    """A unit's masked attention is computed over its whole row: where a key costs enough (a
    narrow model, long samples, a short prompt) two samples apart are cheaper than one row."""
    rng = random.Random(3)
    head = [7, 8, 9, 10]
    tokens = [head + [rng.randrange(20, 200) for _ in range(96)] for _ in range(3)]
    masks = [[0] * 4 + [1] * 96 for _ in range(3)]
    assert [u.rows for u in units_of(tokens, masks)] == [[0, 1, 2]]  # attention free: one row
    assert [u.rows for u in units_of(tokens, masks, key_cost=0.01)] == [[0], [1], [2]]
    short = [head * 20 + t[4:14] for t in tokens]  # an 80-token prompt, 10 tokens each after it
    assert [u.rows for u in units_of(short, [[0] * 80 + [1] * 10] * 3, key_cost=0.01)] == [[0, 1, 2]]
    assert key_cost(576) == pytest.approx(1 / 3456) and key_cost(None) == 0.0


def test_a_units_row_holds_the_prefix_once_and_each_suffix_sees_only_the_prefix_and_itself():
    rs = [{"tokens": [5, 6, 7, 10, 11], "loss_mask": [0, 0, 0, 1, 1]}, {"tokens": [5, 6, 7, 20], "loss_mask": [0, 0, 0, 1]}]
    units = units_of([r["tokens"] for r in rs], [r["loss_mask"] for r in rs])
    layout = SharedRows([r["tokens"] for r in rs], units, pad_id=0)
    assert layout.ids.tolist() == [[5, 6, 7, 10, 11, 20]]
    assert layout.position_ids.tolist() == [[0, 1, 2, 3, 4, 3]]
    m = layout.mask[0, 0].int().tolist()
    assert m == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 0],
        [1, 1, 1, 0, 0, 1],  # the second sample's token: the prefix and itself, not the first's suffix
    ]
    # the hidden state predicting a token: in the prefix before it ends, in the sample's suffix after
    assert layout.hidden_index(0, torch.tensor([0, 2, 3])).tolist() == [0, 2, 3]
    assert layout.hidden_index(1, torch.tensor([2, 3])).tolist() == [2, 5]
    assert layout.real_tokens == 6 and layout.slots == 6


def loss_and_grads(policy: PolicyModel, batch: PaddedBatch, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    policy.zero_grad()
    flat, _ = policy(batch.ids, batch.attn, batch.model_select, 7, False, batch.position_ids, batch.hidden_index, batch.targets)
    lp = batch.pad(flat)
    loss = -(lp * weights).sum() / batch.select.sum()
    loss.backward()
    return lp.detach(), loss.detach(), {n: p.grad.detach().clone() for n, p in policy.named_parameters()}


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_shared_and_padded_give_the_same_log_probs_loss_and_gradients(attention):
    rs = groups([4, 1, 3, 2], seed=2)
    lm = tiny_llama()
    lm.config._attn_implementation = attention
    policy = PolicyModel(lm)
    cpu = torch.device("cpu")
    padded = PaddedBatch(rs, pad_id=0, device=cpu)
    shared = PaddedBatch(rs, pad_id=0, device=cpu, sharing=Sharing(attention))
    assert torch.equal(shared.targets, padded.ids[:, 1:][padded.select])
    assert shared.real_tokens < padded.real_tokens  # the prompts run once per unit
    weights = torch.randn(padded.select.shape, generator=torch.Generator().manual_seed(3)) * padded.select
    lp_pad, loss_pad, grads_pad = loss_and_grads(policy, padded, weights)
    lp_shared, loss_shared, grads_shared = loss_and_grads(policy, shared, weights)
    assert float((lp_shared - lp_pad).abs().max()) < 1e-5
    assert float((loss_shared - loss_pad).abs()) < 1e-6, (loss_shared, loss_pad)
    assert max(float((grads_shared[n] - grads_pad[n]).abs().max()) for n in grads_pad) < 1e-5
    # the mask is what keeps a sample from seeing the others: with plain causal attention over
    # the unit's row (its 4-D mask dropped) the log-probs change
    with torch.no_grad():
        leaked, _ = policy(shared.ids, None, None, 7, False, shared.position_ids, shared.hidden_index, shared.targets)
    assert float((leaked - lp_shared[shared.select]).abs().max()) > 1e-3


@pytest.mark.parametrize(("setting", "impl", "packed", "want"), [
    ("auto", "sdpa", False, True), ("auto", None, False, True), ("auto", "eager", False, True),
    ("auto", "flash_attention_2", False, False), ("auto", "sdpa", True, False), ("off", "sdpa", False, False),
    ("on", "eager", False, True),
])
def test_auto_shares_where_the_attention_takes_a_mask_and_nothing_is_packed(setting, impl, packed, want):
    assert shares_prefixes(setting, impl, packed) is want


@pytest.mark.parametrize(("impl", "packed", "words"), [("flash_attention_2", False, "takes no custom mask"), ("sdpa", True, "packed")])
def test_on_is_refused_where_it_cannot_work(impl, packed, words):
    with pytest.raises(ConfigError, match=words):
        shares_prefixes("on", impl, packed)
    with pytest.raises(ConfigError, match="shared_prefixes must be one of"):
        shares_prefixes("yes", "sdpa", False)


def rl_groups(sizes: list[int], seed: int) -> list[dict[str, Any]]:
    """:func:`groups` as RL samples: behaviour log-probs, an advantage per group member, versions."""
    rng = random.Random(seed)
    out = groups(sizes, seed=seed)
    for i, s in enumerate(out):
        s["behaviour_logprobs"] = [0.0 if m == 0 else -6.0 + rng.uniform(-0.05, 0.05) for m in s["loss_mask"]]
        s["advantage"] = [1.0, -1.0, 0.5][i % 3]
        s["versions"] = [-1 if m == 0 else 0 for m in s["loss_mask"]]
    return out


def test_a_shared_learner_step_gives_the_padded_update_computing_fewer_tokens(tiny_calc_model):
    """Through the learner (one FSDP2 rank, two updates per batch: the proximal log-probs too):
    the same metrics and parameters after an RL step with shared prefixes as without, and the
    plan keeps each group in one micro-batch."""
    samples = rl_groups([4, 4, 3, 4], seed=5)

    def groups_whole(learner) -> None:  # every group fits the budget as a unit: each lies in one micro-batch
        assert learner.sharing is not None
        where = {i: k for k, micro in enumerate(learner.plan(samples)) for i in micro}
        assert sorted(where) == list(range(len(samples)))
        prompt_of = [tuple(s["tokens"][:6]) for s in samples]
        assert all(len({where[i] for i, q in enumerate(prompt_of) if q == p}) == 1 for p in prompt_of)

    model, settings = str(tiny_calc_model), dict(updates_per_batch=2, micro_batch_tokens=64)
    off, before = one_step(model, samples, lambda ln: _none(ln.sharing), shared_prefixes="off", **settings)
    on, after = one_step(model, samples, groups_whole, shared_prefixes="on", **settings)
    assert on["loss"] == pytest.approx(off["loss"], abs=1e-6)
    assert on["entropy"] == pytest.approx(off["entropy"], abs=1e-5)
    assert on["trained_tokens"] == off["trained_tokens"]
    assert max_diff(before, after) < 1e-6


def _none(value: object) -> None:
    assert value is None, value


def test_the_recipes_setting_reaches_the_learner(tiny_calc_model, tmp_path):
    """``learner.shared_prefixes`` goes through wiring into the learner's kwargs; ``on`` under an
    attention that takes no mask is refused when the learner is set up, naming the key."""
    from agentrl.config import load_recipe
    from agentrl.engine import wiring

    recipe_file = tmp_path / "r.toml"
    recipe_file.write_text(f'[model]\npath = "{tiny_calc_model}"\n[learner]\nshared_prefixes = "off"\n')
    kwargs = wiring.learner_kwargs(load_recipe(recipe_file), model=str(tiny_calc_model), tokenizer=None, run_dir=tmp_path)
    assert kwargs["shared_prefixes"] == "off"
    with pytest.raises(ConfigError, match="learner.shared_prefixes = 'on' cannot be used with packed"):
        make_learner(str(tiny_calc_model), shared_prefixes="on", pack_microbatches="on")
    make_learner(str(tiny_calc_model)).shutdown()  # the refused set-up left no process group behind
