"""Two FSDP2 ranks (gloo, two processes) produce the same update as one rank on the same batches.

The batches are planned into several micro-batches per rank, one with an odd number of
micro-batches (a rank runs the zero-weight stand-in), and both runs use the default AdamW eps,
so the comparison covers sharding, the gradient reduction and the optimizer. The 2-rank run
also writes a checkpoint, which is then exported in one process and loaded (re-sharded) into
the 1-rank learner, and the same checkpoint in the background (``checkpoint.background``) while
both ranks train one more step: it holds the same state as the one waited for.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file

from agentrl.engine.training.checkpoint import export_checkpoint
from tests.engine.training.ranks import run_ranks
from tests.engine.training.test_learner_correctness import free_port, make_learner, make_samples, max_diff

OPTS = dict(lr=1e-3, adam_eps=1e-8, grad_clip=1.0, micro_batch_tokens=64, logprob_chunk_tokens=16, torch_threads=1)
BATCHES = [
    make_samples(3, seed=20, min_len=40, max_len=60),  # three micro-batches of one: a stand-in pads rank 1
    make_samples(9, seed=21, min_len=6, max_len=40),
]


def _rank_main(rank: int, model: str, port: int, out: str) -> None:
    from agentrl.engine.training.learner import Learner

    learner = Learner(rank=rank, world_size=2, master_addr="127.0.0.1", master_port=port, model=model, seed=0, **OPTS)
    learner.setup()
    try:
        metrics = [learner.train_step(b) for b in BATCHES]
        learner.publish(os.path.join(out, "published"))
        learner.save_checkpoint(os.path.join(out, "ckpt"))
        learner.save_checkpoint(os.path.join(out, "ckpt_bg"), background=True)
        learner.train_step(BATCHES[0])  # both ranks move on while their shares are written
        assert learner.finish_checkpoint() is not None
        if rank == 0:
            Path(out, "metrics.json").write_text(json.dumps(metrics))
    finally:
        learner.shutdown()


def test_two_ranks_match_one_rank(tiny_calc_model, tmp_path):
    port = free_port()
    run_ranks(_rank_main, lambda r: (r, str(tiny_calc_model), port, str(tmp_path)), timeout_s=120)
    two = load_file(str(tmp_path / "published" / "model.safetensors"))
    two_metrics = json.loads((tmp_path / "metrics.json").read_text())

    one_learner = make_learner(str(tiny_calc_model), **OPTS)
    try:
        one_metrics = [one_learner.train_step(b) for b in BATCHES]
        one = {k: v.clone() for k, v in one_learner.full_state_dict().items()}
        one_learner.load_checkpoint(str(tmp_path / "ckpt"))  # written by 2 ranks, loaded by 1
        resharded = {k: v.clone() for k, v in one_learner.full_state_dict().items()}
        assert one_learner.load_checkpoint(str(tmp_path / "ckpt_bg"))["step"] == 2
        resharded_bg = {k: v.clone() for k, v in one_learner.full_state_dict().items()}
    finally:
        one_learner.shutdown()

    base = load_file(str(Path(tiny_calc_model) / "model.safetensors"))
    moved = max_diff({k: two[k] for k in base}, base)
    diff = max_diff({k: two[k] for k in one}, one)
    print(f"2 ranks vs 1 rank after 2 steps: max |param diff| {diff:.3g} (update size {moved:.3g})")
    assert moved > 1e-3
    assert diff < 1e-5
    for m1, m2 in zip(one_metrics, two_metrics):
        assert m1["trained_tokens"] == m2["trained_tokens"]
        assert abs(m1["loss"] - m2["loss"]) < 1e-5 and abs(m1["grad_norm"] - m2["grad_norm"]) < 1e-4
    assert max_diff({k: two[k] for k in resharded}, resharded) == 0.0
    assert max_diff(resharded_bg, resharded) == 0.0  # the background one: the state at its save, not after the step
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # placed, nothing hidden left
    exported = load_file(str(export_checkpoint(tmp_path / "ckpt", tmp_path / "export") / "model.safetensors"))
    assert max_diff({k: two[k] for k in exported}, exported) == 0.0
    assert torch.equal(exported["lm_head.weight"], two["lm_head.weight"])
