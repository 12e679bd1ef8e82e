import torch

from agentrl.engine.generator import versions_from_spans
from agentrl.engine.learner import plan_microbatches, token_logprobs


def test_plan_respects_budget_and_world():
    lengths = [10, 50, 20, 40, 30]
    plan = plan_microbatches(lengths, token_budget=60, world_size=2)
    assert sorted(i for mb in plan for i in mb) == list(range(5))
    assert len(plan) % 2 == 0
    for mb in plan:
        if mb:
            assert max(lengths[i] for i in mb) * len(mb) <= 60 or len(mb) == 1


def test_oversized_sample_gets_own_microbatch():
    plan = plan_microbatches([100, 5], token_budget=10, world_size=1)
    assert [0] in plan


def test_token_logprobs_matches_log_softmax():
    logits = torch.randn(2, 5, 11)
    targets = torch.randint(0, 11, (2, 5))
    expected = torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(token_logprobs(logits, targets), expected, atol=1e-6)


def test_versions_from_spans():
    spans = [("default", 0, 2), ("1", 2, 4), ("2", 4, 5)]
    assert versions_from_spans(spans, 6, fallback=7) == [0, 0, 1, 1, 2, 7]
