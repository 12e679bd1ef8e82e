"""Policy losses, corrections and aggregation against hand-computed examples."""

import math

import pytest
import torch

from agentrl.algos import (
    ObjectiveSettings,
    aggregate_loss,
    decoupled_ppo_token_loss,
    gspo_ratio,
    kl_penalty,
    policy_loss,
    ppo_clip_token_loss,
    ratio_band_mask,
    truncated_is_weight,
)

LN = math.log


def test_ppo_asymmetric_clip_and_dual_clip():
    # A=+1: ratio 1.5 clipped at 1.28 -> loss -1.28; ratio 0.5 (< 0.8) unclipped for A>0 -> -0.5
    # A=-1: ratio 0.5 clipped at 0.8 -> loss 0.8; ratio 5 -> unclipped 5, dual clip c=3 -> 3
    ratio = torch.tensor([1.5, 0.5, 0.5, 5.0])
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0])
    loss, clipped, dual = ppo_clip_token_loss(ratio, adv, clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    assert torch.allclose(loss, torch.tensor([-1.28, -0.5, 0.8, 3.0]))
    assert clipped.tolist() == [True, False, True, False]
    assert dual.tolist() == [False, False, False, True]
    loss_nd, _, _ = ppo_clip_token_loss(ratio, adv, dual_clip=None)
    assert loss_nd[3].item() == pytest.approx(5.0)


def test_aggregation_modes():
    # row 0: losses 1, 2 (2 tokens); row 1: loss 4 (1 token, one masked); row 2: no tokens
    per_token = torch.tensor([[1.0, 2.0], [4.0, 100.0], [7.0, 7.0]])
    mask = torch.tensor([[1, 1], [1, 0], [0, 0]])
    assert aggregate_loss(per_token, mask, "token-mean").item() == pytest.approx(7 / 3)
    assert aggregate_loss(per_token, mask, "seq-mean-token-sum").item() == pytest.approx(7 / 2)
    assert aggregate_loss(per_token, mask, "seq-mean-token-mean").item() == pytest.approx((1.5 + 4) / 2)
    # batch-level normalisers: micro-batch pieces add up to the whole
    whole = aggregate_loss(per_token, mask, "seq-mean-token-mean")
    parts = sum(aggregate_loss(per_token[i : i + 1], mask[i : i + 1], "seq-mean-token-mean", num_seqs=2) for i in range(3))
    assert parts.item() == pytest.approx(whole.item())
    with pytest.raises(ValueError):
        aggregate_loss(per_token, mask, "sum")


def test_gspo_sequence_ratio_value_and_gradient():
    # one sequence, 2 tokens: log-ratios 0.2 and 0.4 -> s = exp(0.3) on every token
    lp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    anchor = torch.tensor([[-1.2, -2.4]])
    s = gspo_ratio(lp, anchor, torch.ones(1, 2))
    assert torch.allclose(s.detach(), torch.full((1, 2), math.exp(0.3)))
    # mean over tokens of s_t has gradient s/|y| per token, like d s / d lp_t
    s.mean().backward()
    assert torch.allclose(lp.grad, torch.full((1, 2), math.exp(0.3) / 2))


def test_truncated_is_weight_and_band():
    w, trunc = truncated_is_weight(torch.tensor([0.0, LN(1.5), LN(3.0)]), cap=2.0)
    assert torch.allclose(w, torch.tensor([1.0, 1.5, 2.0]))
    assert trunc.tolist() == [False, False, True]
    keep = ratio_band_mask(torch.log(torch.tensor([0.4, 1.0, 2.0, 2.5])), 0.5, 2.0)
    assert keep.tolist() == [False, True, True, False]


def test_decoupled_ppo_hand_computed():
    # token: pi_theta/pi_prox = 1.5 (clipped at 1.28 for A=+1), pi_prox/pi_behav = 3 -> w = C = 2
    lp, prox, behav = torch.tensor([LN(1.5)]), torch.tensor([0.0]), torch.tensor([-LN(3.0)])
    loss, parts = decoupled_ppo_token_loss(lp, prox, behav, torch.tensor([1.0]), is_cap=2.0)
    assert loss.item() == pytest.approx(-2.0 * 1.28)
    assert parts["clipped"].item() and parts["truncated"].item()


def test_kl_estimators():
    lp, ref = torch.tensor([0.0]), torch.tensor([LN(2.0)])
    assert kl_penalty(lp, ref, "k1").item() == pytest.approx(-LN(2.0))
    assert kl_penalty(lp, ref, "k2").item() == pytest.approx(LN(2.0) ** 2 / 2)
    assert kl_penalty(lp, ref, "k3").item() == pytest.approx(1 - LN(2.0))


def test_policy_loss_ratio_one_is_on_policy_gradient():
    """With pi_theta = pi_prox = pi_behav, every variant's gradient is -A * m / N (REINFORCE)."""
    lp0 = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, -9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv = torch.tensor([0.5, -1.5])
    expected = -adv[:, None] * mask / mask.sum()
    for settings in (
        ObjectiveSettings(),
        ObjectiveSettings(off_policy="behaviour"),
        ObjectiveSettings(ratio_band=(0.5, 2.0), is_cap=1.0),
        ObjectiveSettings(off_policy="behaviour", dual_clip=None, clip_high=0.2),
    ):
        lp = lp0.clone().requires_grad_(True)
        loss, stats = policy_loss(lp, lp0, adv, mask, settings)
        loss.backward()
        assert torch.allclose(lp.grad, expected, atol=1e-7), settings
        assert stats["tokens"].item() == 5 and stats["ratio_sum"].item() == pytest.approx(5.0)
        assert stats["clipped"].item() == 0 and stats["band_masked"].item() == 0
    # GSPO with seq-mean-token-mean: -A_i / (|y_i| * N_seq) per token
    lp = lp0.clone().requires_grad_(True)
    loss, _ = policy_loss(lp, lp0, adv, mask, ObjectiveSettings(policy_loss="gspo", loss_agg="seq-mean-token-mean"))
    loss.backward()
    assert torch.allclose(lp.grad, -adv[:, None] * mask / mask.sum(-1, keepdim=True) / 2, atol=1e-7)


def test_policy_loss_hand_computed_off_policy():
    # two tokens of one sequence, A = +1, proximal = current (detached):
    #   token 0: pi_prox/pi_behav = 3 -> w = 2 (capped), r = 1 -> l = -2
    #   token 1: pi_prox/pi_behav = 0.25 -> outside band (0.5, 4) -> dropped
    # token-mean over 2 tokens: -1
    lp = torch.tensor([[LN(0.3), LN(0.1)]], requires_grad=True)
    behav = torch.tensor([[LN(0.1), LN(0.4)]])
    s = ObjectiveSettings(is_cap=2.0, ratio_band=(0.5, 4.0))
    loss, stats = policy_loss(lp, behav, torch.tensor([1.0]), torch.ones(1, 2), s)
    assert loss.item() == pytest.approx(-1.0)
    assert stats["is_truncated"].item() == 1 and stats["band_masked"].item() == 1
    loss.backward()
    assert torch.allclose(lp.grad, torch.tensor([[-1.0, 0.0]]))
    # classic PPO against the behaviour policy clips token 0 (ratio 3 > 1.28): gradient 0 there
    lp2 = lp.detach().clone().requires_grad_(True)
    loss2, st2 = policy_loss(lp2, behav, torch.tensor([1.0]), torch.ones(1, 2), ObjectiveSettings(off_policy="behaviour"))
    assert loss2.item() == pytest.approx((-1.28 - 0.25) / 2)
    assert st2["clipped"].item() == 1


def test_policy_loss_kl_term_needs_reference():
    lp = torch.zeros(1, 1, requires_grad=True)
    s = ObjectiveSettings(kl_coef=0.1)
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss(lp, lp.detach(), torch.zeros(1), torch.ones(1, 1), s)
    loss, stats = policy_loss(lp, lp.detach(), torch.zeros(1), torch.ones(1, 1), s, ref_logprobs=torch.full((1, 1), LN(2.0)))
    assert loss.item() == pytest.approx(0.1 * (1 - LN(2.0)))
    assert stats["kl_sum"].item() == pytest.approx(1 - LN(2.0))


def test_settings_validation():
    for bad in ({"policy_loss": "trpo"}, {"loss_agg": "x"}, {"dual_clip": 0.5}, {"ratio_band": (1.5, 2.0)}, {"is_cap": 0}):
        with pytest.raises(ValueError):
            ObjectiveSettings(**bad)
