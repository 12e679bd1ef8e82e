"""The learner computes what it should: log-probs, entropy and gradients against plain transformers.

Each test runs one FSDP2 rank over gloo in this process. Parameter updates are compared after
one AdamW step with ``adam_eps = 1``: for gradients far below 1 the step is then nearly linear
in the gradient (``lr * g / (|g| + 1)``), so an update compares gradients, whereas with the
default eps the first Adam step is close to ``lr * sign(g)`` and hides them.
"""

from __future__ import annotations

import random
import socket
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from agentrl.algos import ObjectiveSettings
from agentrl.engine.training.learner import Learner

LR = 1e-2
ADAM_EPS = 1.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_samples(n: int, seed: int, min_len: int = 6, max_len: int = 40, vocab: int = 400) -> list[dict[str, Any]]:
    """Random RL samples: a 4-token prompt (mask 0), then generated tokens (mask 1), with a
    made-up behaviour log-prob, an advantage of +-1 (or 0.5) and version 0 per token."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        length = rng.randint(min_len, max_len)
        tokens = [rng.randrange(3, vocab) for _ in range(length)]
        mask = [0] * 4 + [1] * (length - 4)
        out.append({
            "tokens": tokens,
            "loss_mask": mask,
            "behaviour_logprobs": [0.0 if m == 0 else -6.0 + rng.uniform(-0.05, 0.05) for m in mask],
            "advantage": [1.0, -1.0, 0.5][i % 3],
            "versions": [-1 if m == 0 else 0 for m in mask],
        })
    return out


def make_learner(model: str, **kwargs: Any) -> Learner:
    opts: dict[str, Any] = dict(
        rank=0, world_size=1, master_addr="127.0.0.1", master_port=free_port(), model=model,
        lr=LR, adam_eps=ADAM_EPS, grad_clip=1e9, micro_batch_tokens=96, logprob_chunk_tokens=16, seed=0,
    )
    opts.update(kwargs)
    learner = Learner(**opts)
    learner.setup()
    return learner


def params(learner: Learner) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in learner.full_state_dict().items()}


def one_step(model: str, samples: list[dict[str, Any]], inspect: Any = None, **kwargs: Any) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    """A fresh learner (``make_learner(model, **kwargs)``; ``inspect(learner)`` first, when given)
    trains one RL step on ``samples``: its metrics and its parameters after it."""
    learner = make_learner(model, **kwargs)
    try:
        if inspect is not None:
            inspect(learner)
        return learner.train_step(samples), params(learner)
    finally:
        learner.shutdown()


def reference_logprobs(model: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    """log pi(tokens[t] | tokens[:t]) for t >= 1 from the full logits of one unpadded sequence."""
    ids = torch.tensor([tokens])
    logits = model(input_ids=ids).logits.float()[0, :-1]
    return torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None]).squeeze(-1)


def expected_adamw_update(model: torch.nn.Module, samples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Parameters after one AdamW step (lr LR, eps ADAM_EPS) on the on-policy (REINFORCE) loss
    ``-(1/N) * sum_i A_i * sum_t m_it * log pi(y_it)``, computed with plain transformers."""
    n = sum(sum(s["loss_mask"][1:]) for s in samples)
    model.zero_grad()
    for s in samples:
        lp = reference_logprobs(model, s["tokens"])
        m = torch.tensor(s["loss_mask"][1:], dtype=torch.float32)
        (-(s["advantage"] * lp * m).sum() / n).backward()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, eps=ADAM_EPS, weight_decay=0.0)
    opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def test_logprobs_and_entropy_match_plain_transformers(tiny_calc_model):
    samples = make_samples(7, seed=1)
    for s in samples:
        s["loss_mask"] = [0] + [1] * (len(s["tokens"]) - 1)  # every position
    ref_model = AutoModelForCausalLM.from_pretrained(tiny_calc_model, dtype=torch.float32)
    learner = make_learner(str(tiny_calc_model))
    try:
        got = learner.compute_logprobs(samples)  # padded micro-batches, chunked projection
        worst = 0.0
        for s, lp in zip(samples, got):
            want = reference_logprobs(ref_model, s["tokens"]).detach()
            worst = max(worst, float((torch.tensor(lp[1:]) - want).abs().max()))
            assert lp[0] == 0.0
        assert worst < 2e-5, worst
        # entropy metric: mean over trained tokens of the full distribution's entropy
        with torch.no_grad():
            ents = []
            for s in samples:
                logits = ref_model(input_ids=torch.tensor([s["tokens"]])).logits.float()[0, :-1]
                ents.append(-(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1))
            want_entropy = float(torch.cat(ents).mean())
        metrics = learner.train_step(samples)
        assert metrics["entropy"] == pytest.approx(want_entropy, abs=1e-4)
        assert metrics["trained_tokens"] == sum(len(s["tokens"]) - 1 for s in samples)
        assert 0.0 <= metrics["padding_fraction"] < 0.5
    finally:
        learner.shutdown()


@pytest.mark.parametrize("off_policy", ["decoupled", "behaviour"])
def test_ratio_one_reduces_to_the_on_policy_gradient(tiny_calc_model, off_policy):
    """Behaviour log-probs equal to the learner's own: ratio 1 and weight 1, so the update is the
    one of plain REINFORCE (computed with transformers and torch.optim.AdamW)."""
    samples = make_samples(6, seed=2)
    ref_model = AutoModelForCausalLM.from_pretrained(tiny_calc_model, dtype=torch.float32)
    learner = make_learner(str(tiny_calc_model), objective=ObjectiveSettings(off_policy=off_policy))
    try:
        own = learner.compute_logprobs(samples)
        for s, lp in zip(samples, own):
            s["behaviour_logprobs"] = lp
        metrics = learner.train_step(samples)
        assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
        assert metrics["is_weight_mean"] == pytest.approx(1.0, abs=1e-6)
        assert metrics["clip_fraction"] == 0.0
        assert metrics["logprob_abs_diff"] < 1e-6 and metrics["logprob_abs_diff_current"] < 1e-6
        got = params(learner)
    finally:
        learner.shutdown()
    want = expected_adamw_update(ref_model, samples)
    before = AutoModelForCausalLM.from_pretrained(tiny_calc_model, dtype=torch.float32).state_dict()
    moved = max_diff(want, {k: v for k, v in before.items()})
    assert moved > 1e-4  # the step did something measurable
    assert max_diff(got, want) < 1e-3 * moved


def test_activation_checkpointing_gives_the_same_update(tiny_calc_model):
    samples = make_samples(5, seed=3)
    results = []
    for ckpt in (False, True):
        learner = make_learner(str(tiny_calc_model), activation_checkpointing=ckpt)
        try:
            learner.train_step(samples)
            results.append(params(learner))
        finally:
            learner.shutdown()
    assert max_diff(*results) < 1e-6


def test_recomputed_proximal_logprobs_with_several_updates(tiny_calc_model):
    """Two updates per batch: the second mini-batch's ratio against the recomputed proximal
    policy is no longer 1 (the first update moved the weights), so a large step gets clipped;
    with detached proximal log-probs the ratio stays 1 and nothing is clipped."""
    samples = make_samples(8, seed=4)
    seen = {}
    for proximal in ("recompute", "detached"):
        learner = make_learner(str(tiny_calc_model), lr=0.5, adam_eps=1e-8, updates_per_batch=2, proximal=proximal)
        try:
            seen[proximal] = learner.train_step(samples)
            assert seen[proximal]["updates"] == 2 and seen[proximal]["step"] == 1
        finally:
            learner.shutdown()
    assert seen["recompute"]["clip_fraction"] > 0.0
    assert abs(seen["recompute"]["ratio_mean"] - 1.0) > 1e-3
    assert seen["detached"]["clip_fraction"] == 0.0
    assert seen["detached"]["ratio_mean"] == pytest.approx(1.0, abs=1e-6)


def test_reference_model_kl_term(tiny_calc_model):
    samples = make_samples(4, seed=5)
    learner = make_learner(str(tiny_calc_model), lr=0.05, adam_eps=1e-8, objective=ObjectiveSettings(kl_coef=0.1))
    try:
        first = learner.train_step(samples)  # policy == reference: KL exactly 0
        second = learner.train_step(samples)
    finally:
        learner.shutdown()
    assert abs(first["kl_ref"]) < 1e-7
    assert second["kl_ref"] > 1e-6


def test_malformed_samples_raise_learner_error(tiny_calc_model):
    from agentrl.errors import LearnerError

    learner = make_learner(str(tiny_calc_model))
    try:
        bad = make_samples(1, seed=6)
        bad[0]["loss_mask"] = bad[0]["loss_mask"][:-1]
        with pytest.raises(LearnerError, match="differ in length"):
            learner.train_step(bad)
        oov = make_samples(1, seed=6)
        oov[0]["tokens"][5] = 10**6
        with pytest.raises(LearnerError, match="vocabulary"):
            learner.train_step(oov)
        assert learner.train_step([])["trained_tokens"] == 0.0  # an empty batch (all groups filtered)
    finally:
        learner.shutdown()


def test_per_token_advantages_equal_to_the_scalar_give_the_same_update(tiny_calc_model) -> None:
    ss = make_samples(6, seed=4)
    per_token = [{**{k: v for k, v in s.items() if k != "advantage"}, "advantages": [s["advantage"]] * len(s["tokens"])} for s in ss]
    a = make_learner(str(tiny_calc_model))
    try:
        ma = a.train_step(ss)
        wa = {k: v.clone() for k, v in a.full_state_dict().items()}
    finally:
        a.shutdown()
    b = make_learner(str(tiny_calc_model))
    try:
        mb = b.train_step(per_token)
        wb = b.full_state_dict()
        held = b.hold_step()
    finally:
        b.shutdown()
    assert mb["loss"] == pytest.approx(ma["loss"], rel=1e-6)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert held["step"] == 2.0 and held["trained_tokens"] == 0.0


def test_a_per_token_advantage_moves_only_its_token(tiny_calc_model) -> None:
    """Advantage on one token only: the loss's gradient comes from that token alone (the loss is
    a token mean, so the others contribute exactly zero)."""
    s = make_samples(1, seed=5, min_len=12, max_len=12)[0]
    only = [0.0] * 12
    only[7] = 1.0
    learner = make_learner(str(tiny_calc_model))
    try:
        m = learner.train_step([{**{k: v for k, v in s.items() if k != "advantage"}, "advantages": only}])
    finally:
        learner.shutdown()
    assert m["grad_norm"] > 0
    learner = make_learner(str(tiny_calc_model))
    try:
        m0 = learner.train_step([{**{k: v for k, v in s.items() if k != "advantage"}, "advantages": [0.0] * 12}])
    finally:
        learner.shutdown()
    assert m0["grad_norm"] == 0.0
