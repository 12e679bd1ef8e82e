"""GAE over action tokens and the clipped value loss, against hand-computed examples."""

from __future__ import annotations

import pytest
import torch

from agentrl.algos.gae import gae_advantages, whiten
from agentrl.algos.value_loss import clipped_value_loss


def reference_gae(rewards: list[float], values: list[float], gamma: float, lam: float) -> list[float]:
    """Textbook GAE over a sequence where every step is an action (terminal after the last)."""
    adv, nxt_v, nxt_a = [0.0] * len(rewards), 0.0, 0.0
    for t in reversed(range(len(rewards))):
        delta = rewards[t] + gamma * nxt_v - values[t]
        nxt_a = delta + gamma * lam * nxt_a
        adv[t], nxt_v = nxt_a, values[t]
    return adv


def test_docstring_example() -> None:
    r = torch.tensor([[0.0, 0.0, 0.0, 1.0]])
    v = torch.tensor([[9.0, 0.5, 9.0, 0.8]])  # 9.0: positions off the mask, must not matter
    m = torch.tensor([[0, 1, 0, 1]])
    adv, ret = gae_advantages(r, v, m, gamma=1.0, lam=0.5)
    assert adv[0].tolist() == pytest.approx([0.0, 0.4, 0.0, 0.2])
    assert ret[0].tolist() == pytest.approx([0.0, 0.9, 0.0, 1.0])


def test_matches_textbook_gae_when_every_token_is_an_action() -> None:
    g = torch.Generator().manual_seed(0)
    r, v = torch.rand(6, generator=g), torch.rand(6, generator=g)
    adv, ret = gae_advantages(r[None], v[None], torch.ones(1, 6), gamma=0.9, lam=0.7)
    assert adv[0].tolist() == pytest.approx(reference_gae(r.tolist(), v.tolist(), 0.9, 0.7), abs=1e-6)
    assert ret[0].tolist() == pytest.approx((adv[0] + v).tolist(), abs=1e-6)


def test_tool_output_tokens_are_skipped_not_discounted() -> None:
    """Inserting non-action positions (tool output) anywhere changes no action token's advantage."""
    r = [0.0, 0.0, 0.0, 1.0]
    v = [0.2, 0.4, 0.6, 0.7]
    dense, _ = gae_advantages(torch.tensor([r]), torch.tensor([v]), torch.ones(1, 4), gamma=0.95, lam=0.9)
    # the same four actions with a 3-token tool output after the second and one glue token at the start
    layout = [0, 1, 1, 0, 0, 0, 1, 1]
    rr, vv, k = [], [], 0
    for is_action in layout:
        rr.append(r[k] if is_action else 0.0)
        vv.append(v[k] if is_action else -5.0)
        k += is_action
    sparse, _ = gae_advantages(torch.tensor([rr]), torch.tensor([vv]), torch.tensor([layout]), gamma=0.95, lam=0.9)
    assert sparse[0][torch.tensor(layout, dtype=torch.bool)].tolist() == pytest.approx(dense[0].tolist())


def test_gamma_lambda_one_gives_reward_minus_value() -> None:
    r = torch.tensor([[0.0, 0.0, 2.0]])
    v = torch.tensor([[0.5, 1.0, 1.5]])
    adv, ret = gae_advantages(r, v, torch.ones(1, 3), gamma=1.0, lam=1.0)
    assert adv[0].tolist() == pytest.approx([1.5, 1.0, 0.5])
    assert ret[0].tolist() == pytest.approx([2.0, 2.0, 2.0])


def test_rows_are_independent_and_bad_input_is_refused() -> None:
    r = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    v = torch.zeros(2, 2)
    adv, _ = gae_advantages(r, v, torch.ones(2, 2), 1.0, 1.0)
    assert adv[1].tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="zero where mask is 0"):
        gae_advantages(torch.tensor([[1.0, 0.0]]), torch.zeros(1, 2), torch.tensor([[0, 1]]))
    with pytest.raises(ValueError, match="gamma"):
        gae_advantages(r, v, torch.ones(2, 2), gamma=1.5)
    with pytest.raises(ValueError, match="shape"):
        gae_advantages(r, torch.zeros(2, 3), torch.ones(2, 2))


def test_whiten_over_the_mask_only() -> None:
    x = torch.tensor([[1.0, 100.0, 3.0]])
    m = torch.tensor([[1, 0, 1]])
    w = whiten(x, m)
    assert w[0].tolist() == pytest.approx([-1.0, 0.0, 1.0], abs=1e-6)
    assert whiten(x, torch.zeros(1, 3)).tolist() == [[0.0, 0.0, 0.0]]


def test_clipped_value_loss_docstring_example_and_plain_mode() -> None:
    v, old, ret, m = torch.tensor([[1.0]]), torch.tensor([[0.5]]), torch.tensor([[0.0]]), torch.ones(1, 1)
    loss, stats = clipped_value_loss(v, old, ret, m, clip=0.2)
    assert float(loss) == pytest.approx(0.5)
    assert float(stats["clipped"]) == 0.0  # the unclipped error was the larger
    # a value that moved past the clip towards the return: the clipped (larger) error binds
    loss, stats = clipped_value_loss(torch.tensor([[0.1]]), old, ret, m, clip=0.2)
    assert float(loss) == pytest.approx(0.5 * 0.3**2)
    assert float(stats["clipped"]) == 1.0
    loss, _ = clipped_value_loss(torch.tensor([[0.1]]), old, ret, m, clip=None)
    assert float(loss) == pytest.approx(0.5 * 0.1**2)


def test_value_loss_is_a_mean_over_action_tokens_and_has_gradient() -> None:
    v = torch.tensor([[1.0, 5.0, 3.0]], requires_grad=True)
    ret = torch.tensor([[0.0, 0.0, 1.0]])
    m = torch.tensor([[1, 0, 1]])
    loss, stats = clipped_value_loss(v, v.detach(), ret, m, clip=None)
    assert float(loss.detach()) == pytest.approx(0.5 * (1.0 + 4.0) / 2)
    assert float(stats["tokens"]) == 2.0
    loss.backward()
    assert v.grad[0].tolist() == pytest.approx([0.5, 0.0, 1.0])
    with pytest.raises(ValueError):
        clipped_value_loss(v, v, ret, m, clip=0.0)
