import math

import pytest
import torch

from agentrl.algos import dr_grpo_advantages, group_advantages, grpo_advantages, ppo_clip_loss


def test_grpo_hand_computed():
    # rewards 1,0,0,1: mean 0.5, population std 0.5 -> +-1
    adv = grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), eps=0.0)
    assert adv.tolist() == [1.0, -1.0, -1.0, 1.0]


def test_grpo_equal_rewards_give_zero():
    assert grpo_advantages(torch.tensor([1.0, 1.0, 1.0])).tolist() == [0.0, 0.0, 0.0]


def test_dr_grpo_hand_computed():
    assert dr_grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0])).tolist() == [0.75, -0.25, -0.25, -0.25]


def test_group_advantages_unknown():
    with pytest.raises(ValueError, match="unknown advantage"):
        group_advantages([[1.0]], "nope")


def test_ppo_clip_hand_computed():
    # token 0: ratio e^0.5=1.6487 > 1.28, A=+1 -> clipped: loss -1.28
    # token 1: ratio 1, A=-2 -> loss 2
    # token 2: masked out
    lp = torch.tensor([0.5, 0.0, 3.0])
    old = torch.tensor([0.0, 0.0, 0.0])
    adv = torch.tensor([1.0, -2.0, 5.0])
    mask = torch.tensor([1, 1, 0])
    loss, stats = ppo_clip_loss(lp, old, adv, mask, clip_low=0.2, clip_high=0.28)
    assert math.isclose(loss.item(), -1.28 + 2.0, rel_tol=1e-6)
    assert stats["clipped"].item() == 1.0


def test_ratio_one_reduces_to_policy_gradient():
    # with logprobs == old_logprobs, grad of the loss is -A * grad(logprob)
    lp = torch.tensor([-1.0, -2.0], requires_grad=True)
    adv = torch.tensor([0.5, -1.5])
    loss, _ = ppo_clip_loss(lp, lp.detach(), adv, torch.ones(2))
    loss.backward()
    assert torch.allclose(lp.grad, -adv)
