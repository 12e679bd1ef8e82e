import math
import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from agentrl.engine.generation.generator import versions_from_spans
from agentrl.engine.training.learner import lr_multiplier, token_logprobs
from agentrl.engine.training.microbatch import plan_microbatches
from agentrl.engine.training.logprobs import chunked_token_logprobs


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


def test_plan_splits_before_padding_with_empty_microbatches():
    # one micro-batch of 4 fits the budget; 2 ranks -> split in two rather than leave a rank idle
    plan = plan_microbatches([10, 10, 9, 9], token_budget=100, world_size=2)
    assert len(plan) == 2 and all(len(mb) == 2 for mb in plan)
    # three singletons cannot be split: one empty micro-batch pads the plan to 4
    plan = plan_microbatches([50, 50, 50], token_budget=60, world_size=2)
    assert sorted(len(mb) for mb in plan) == [0, 1, 1, 1]


def test_plan_padding_is_small_for_a_length_spread():
    g = torch.Generator().manual_seed(0)
    lengths = (torch.rand(256, generator=g) * 900 + 100).long().tolist()
    plan = plan_microbatches(lengths, token_budget=4096, world_size=1)
    slots = sum(max(lengths[i] for i in mb) * len(mb) for mb in plan)
    assert 1 - sum(lengths) / slots < 0.05


def test_lr_schedules():
    cos = [lr_multiplier(s, warmup_steps=2, total_steps=6, schedule="cosine") for s in range(7)]
    expected = [0.5, 1, 1, (1 + math.cos(math.pi / 4)) / 2, 0.5, (1 + math.cos(3 * math.pi / 4)) / 2, 0]
    assert cos == pytest.approx(expected)
    lin = [lr_multiplier(s, warmup_steps=0, total_steps=4, schedule="linear", min_lr_ratio=0.2) for s in range(5)]
    assert lin == pytest.approx([1, 0.8, 0.6, 0.4, 0.2])
    assert lr_multiplier(10, warmup_steps=3, schedule="constant") == 1.0
    with pytest.raises(ValueError):
        lr_multiplier(5, schedule="cosine")


def test_token_logprobs_matches_log_softmax():
    logits = torch.randn(2, 5, 11)
    targets = torch.randint(0, 11, (2, 5))
    expected = torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(token_logprobs(logits, targets), expected, atol=1e-6)


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.6])
def test_chunked_logprobs_entropy_and_gradients_match_full_logits(temperature):
    torch.manual_seed(0)
    h = torch.randn(13, 8, requires_grad=True)
    w = torch.randn(37, 8, requires_grad=True)
    b = torch.randn(37, requires_grad=True)
    t = torch.randint(0, 37, (13,))
    lp, ent = chunked_token_logprobs(h, w, t, bias=b, chunk_tokens=4, with_entropy=True, temperature=temperature)
    z = (h @ w.T + b) / temperature  # the distribution sampled at this temperature
    ref = torch.log_softmax(z, -1).gather(-1, t[:, None]).squeeze(-1)
    ref_ent = -(torch.softmax(z, -1) * torch.log_softmax(z, -1)).sum(-1)
    assert torch.allclose(lp, ref, atol=1e-5) and torch.allclose(ent, ref_ent, atol=1e-5)
    g = torch.randn(13)
    got = torch.autograd.grad((lp * g).sum(), (h, w, b))
    want = torch.autograd.grad((ref * g).sum(), (h, w, b))
    for a, e in zip(got, want):
        assert torch.allclose(a, e, atol=1e-5)


def test_chunked_logprobs_refuse_a_non_positive_temperature():
    with pytest.raises(ValueError, match="temperature"):
        chunked_token_logprobs(torch.randn(2, 4), torch.randn(5, 4), torch.tensor([0, 1]), temperature=0.0)


def test_versions_from_spans():
    spans = [("default", 0, 2), ("1", 2, 4), ("2", 4, 5)]
    assert versions_from_spans(spans, 6, fallback=7) == [0, 0, 1, 1, 2, 7]


class _LiveWideTensors(TorchDispatchMode):
    """Bytes of tensors ``width`` columns wide (a chunk of logits and what is computed from it)
    alive at once among the outputs of the ops run under it: the current and the peak figure."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.width, self.live, self.peak, self.storages = width, 0, 0, set()

    def _gone(self, key: int, nbytes: int) -> None:
        self.storages.discard(key)
        self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.dim() == 2 and t.shape[-1] == self.width:
                key = t.untyped_storage().data_ptr()
                if key in self.storages:  # a view, or an in-place op's result
                    continue
                nbytes = t.untyped_storage().nbytes()
                self.storages.add(key)
                self.live += nbytes
                self.peak = max(self.peak, self.live)
                weakref.finalize(t, self._gone, key, nbytes)
        return out


def test_chunked_logprobs_hold_three_chunks_of_logits_at_most():
    """A chunk's logits and what is computed from them are freed before the next chunk's are
    made, in the forward and in the backward pass: at most three chunk-sized float32 tensors are
    alive at once (the logits, a temporary and the softmax), not the previous chunk's beside the
    next's (the H100 run's steady-state peak held one chunk more than the memory plan counts)."""
    vocab, chunk = 5003, 4
    h = torch.randn(12, 8, requires_grad=True)
    w = torch.randn(vocab, 8, requires_grad=True)
    t = torch.randint(0, vocab, (12,))
    with _LiveWideTensors(vocab) as live:
        lp, _ = chunked_token_logprobs(h, w, t, chunk_tokens=chunk, with_entropy=True)
        lp.sum().backward()
    one_chunk = chunk * vocab * 4
    assert one_chunk <= live.peak <= 3 * one_chunk, live.peak / one_chunk
