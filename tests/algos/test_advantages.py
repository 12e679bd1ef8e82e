"""Advantage estimators, filters and penalties against hand-computed examples."""

import math

import pytest
import torch

from agentrl.algos import (
    compute_advantages,
    dr_grpo_advantages,
    group_advantages,
    grpo_advantages,
    nonzero_variance_mask,
    overlong_penalty,
    reinforce_pp_advantages,
    rloo_advantages,
)

R = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64)


def close(a, b, tol=1e-9):
    return torch.allclose(torch.as_tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64), atol=tol)


def test_grpo_two_groups_of_different_size():
    # group 0: (1, 0) mean .5 std .5 -> (1, -1); group 1: (2, 2, 5) mean 3 std sqrt(2) -> (-1,-1,2)/sqrt(2)
    r = torch.tensor([1.0, 0.0, 2.0, 2.0, 5.0], dtype=torch.float64)
    g = torch.tensor([7, 7, 3, 3, 3])
    s = 1 / math.sqrt(2)
    assert close(grpo_advantages(r, g, eps=0.0), [1, -1, -s, -s, 2 * s])


def test_dr_grpo_per_group():
    g = torch.tensor([0, 0, 1, 1])
    assert close(dr_grpo_advantages(torch.tensor([1.0, 0.0, 3.0, 1.0], dtype=torch.float64), g), [0.5, -0.5, 1, -1])


def test_rloo_hand_computed():
    # leave-one-out: 1 - 0 = 1; 0 - (1+0+0)/3 = -1/3
    assert close(rloo_advantages(R), [1, -1 / 3, -1 / 3, -1 / 3])
    # (3, 1): 3 - 1 = 2 and 1 - 3 = -2; a group of one sample has no baseline -> 0
    assert close(rloo_advantages(torch.tensor([3.0, 1.0, 2.0], dtype=torch.float64), torch.tensor([0, 0, 1])), [2, -2, 0])


def test_reinforce_pp_batch_normalised():
    # mean .25, population std sqrt(3)/4
    s3 = math.sqrt(3)
    assert close(reinforce_pp_advantages(R, eps=0.0), [s3, -1 / s3, -1 / s3, -1 / s3])
    # the same rewards in two groups: plain REINFORCE++ ignores groups
    assert close(reinforce_pp_advantages(R, torch.tensor([0, 0, 1, 1]), eps=0.0), [s3, -1 / s3, -1 / s3, -1 / s3])


def test_reinforce_pp_baseline_subtracts_group_mean_then_batch_normalises():
    # groups (1, 0) and (0, 0): centred (.5, -.5, 0, 0); batch mean 0, std sqrt(.125)
    a = reinforce_pp_advantages(R, torch.tensor([0, 0, 1, 1]), subtract_group_mean=True, eps=0.0)
    s = math.sqrt(0.125)
    assert close(a, [0.5 / s, -0.5 / s, 0, 0])


def test_compute_advantages_by_name_and_nested():
    assert group_advantages([[1.0, 0.0], [1.0, 1.0]], "dr_grpo") == [[0.5, -0.5], [0.0, 0.0]]
    assert close(compute_advantages(R, None, "rloo"), [1, -1 / 3, -1 / 3, -1 / 3])
    assert group_advantages([], "grpo") == []
    with pytest.raises(ValueError, match="unknown advantage"):
        compute_advantages(R, None, "nope")


def test_zero_variance_groups_are_dropped():
    keep = nonzero_variance_mask(torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5]), torch.tensor([0, 0, 1, 1, 2]))
    assert keep.tolist() == [False, False, True, True, False]


def test_overlong_penalty_ramp():
    pen = overlong_penalty(torch.tensor([6, 8, 10, 12]), max_tokens=10, buffer_tokens=4)
    assert close(pen, [0.0, -0.5, -1.0, -1.0])
    with pytest.raises(ValueError):
        overlong_penalty(torch.tensor([1]), max_tokens=4, buffer_tokens=5)
