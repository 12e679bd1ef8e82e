"""Two FSDP2 ranks (gloo, two processes) build their models on the meta device and get the weights
from rank 0 (:func:`agentrl.engine.training.model_setup.load_sharded`).

One pair of processes runs four set-ups in turn:

0. a learner on a folder that does not exist: rank 0's error reaches rank 1 (no rank waits);
1. a learner on a bfloat16 checkpoint of about 100 M parameters (380 MiB in float32, the dtype it
   trains in). Each rank samples its private (anonymous) resident memory around ``setup()``: it
   must stay below one float32 copy of the model (each rank used to convert the whole model to
   float32 before sharding it). The gathered parameters must equal, bit for bit, what
   ``from_pretrained(dtype=float32)`` (the old path's load) gives, and every rank's rotary
   buffers (not in the state dict) must be the loaded model's;
2. a critic (value model) on the tiny model: its trunk equals the checkpoint's, its head is zero;
3. a LoRA learner on the tiny model: base and adapter (initialised from the seed on rank 0)
   equal a one-rank learner's, bit for bit.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import torch
from tests.engine.training.ranks import run_ranks
from tests.engine.training.test_learner_correctness import free_port

LORA = {"rank": 4, "alpha": 8.0}


def _anon_mib() -> float:
    """This process's private resident memory (RssAnon), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no RssAnon in /proc/self/status")


class _PeakSampler:
    """Samples RssAnon every millisecond in a thread; ``peak`` is the largest value seen."""

    def __init__(self) -> None:
        self.peak = _anon_mib()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, _anon_mib())

    def __enter__(self) -> _PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.peak = max(self.peak, _anon_mib())


def _rank_main(rank: int, big: str, tiny: str, ports: list[int], out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from agentrl.engine.training.critic import Critic
    from agentrl.engine.training.learner import Learner

    report: dict[str, Any] = {}
    missing = Learner(rank=rank, world_size=2, master_addr="127.0.0.1", master_port=ports[3], model=big + "-missing")
    try:
        missing.setup()
    except Exception as exc:  # rank 0 cannot load it; rank 1 hears why instead of waiting
        report["error"] = f"{type(exc).__name__}: {exc}"
    assert not dist.is_initialized()

    learner = Learner(rank=rank, world_size=2, master_addr="127.0.0.1", master_port=ports[0], model=big, seed=0)
    base = _anon_mib()
    with _PeakSampler() as sampler:
        learner.setup()
    report["peak_mib"] = sampler.peak - base
    state = learner.full_state_dict()
    rotary = {k: b.clone() for k, b in learner.policy.named_buffers() if "rotary" in k}
    dtypes = sorted({str(p.dtype) for p in learner.policy.parameters()})
    learner.shutdown()
    torch.save(rotary, Path(out, f"rotary{rank}.pt"))  # not in the state dict: every rank's own
    if rank == 0:
        torch.save({"state": state, "dtypes": dtypes}, Path(out, "learner.pt"))
    del learner, state

    critic = Critic(rank=rank, world_size=2, master_addr="127.0.0.1", master_port=ports[1], model=tiny, seed=0)
    critic.setup()
    full = get_model_state_dict(critic.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    critic.shutdown()
    if rank == 0:
        torch.save(full, Path(out, "critic.pt"))

    lora = Learner(rank=rank, world_size=2, master_addr="127.0.0.1", master_port=ports[2], model=tiny, seed=0, lora=LORA)
    lora.setup()
    state = lora.full_state_dict()
    lora.shutdown()
    if rank == 0:
        torch.save(state, Path(out, "lora.pt"))
    Path(out, f"report{rank}.json").write_text(json.dumps(report))
    assert not dist.is_initialized()


def _bf16_checkpoint(folder: Path) -> Path:
    """A randomly initialised Qwen2 of ~100 M parameters, saved in bfloat16 (as hub models are)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=8, num_attention_heads=12,
        num_key_value_heads=4, tie_word_embeddings=False, max_position_embeddings=512,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(folder)
    return folder


def test_two_ranks_build_on_meta_and_get_rank_0s_weights(tiny_calc_model, tmp_path):
    from agentrl.engine.training.learner import Learner
    from agentrl.models.loading import load_causal_lm
    from tests.engine.training.test_learner_correctness import make_learner

    big = _bf16_checkpoint(tmp_path / "bf16-model")
    ports = [free_port() for _ in range(4)]
    run_ranks(_rank_main, lambda r: (r, str(big), str(tiny_calc_model), ports, str(tmp_path)), timeout_s=240)

    # 0. a model rank 0 cannot load: every rank raises, naming it
    errors = [json.loads(Path(tmp_path, f"report{r}.json").read_text())["error"] for r in range(2)]
    assert errors[0].startswith("ModelError") and "bf16-model-missing" in errors[0], errors
    assert errors[1].startswith("LearnerError: learner rank 1: rank 0 could not build the model") and "ModelError" in errors[1], errors

    # 1. the learner on the bfloat16 checkpoint: below one float32 copy per rank, same weights
    old_path = load_causal_lm(str(big), dtype=torch.float32)  # what every rank used to load
    fp32_mib = sum(p.numel() for p in old_path.parameters()) * 4 / 2**20
    peaks = [json.loads(Path(tmp_path, f"report{r}.json").read_text())["peak_mib"] for r in range(2)]
    print(f"private memory added by setup(): rank 0 {peaks[0]:.0f} MiB, rank 1 {peaks[1]:.0f} MiB; "
          f"one float32 copy of the model: {fp32_mib:.0f} MiB")
    assert all(peak < fp32_mib for peak in peaks), (peaks, fp32_mib)
    got = torch.load(Path(tmp_path, "learner.pt"))
    assert got["dtypes"] == ["torch.float32"]  # trained in float32 from a bfloat16 checkpoint
    want = old_path.state_dict()
    assert sorted(got["state"]) == sorted(want)
    assert all(torch.equal(got["state"][k], want[k]) for k in want), [k for k in want if not torch.equal(got["state"][k], want[k])]
    rotary = dict(old_path.named_buffers())
    for r in range(2):
        mine = torch.load(Path(tmp_path, f"rotary{r}.pt"))
        assert mine and all(torch.equal(b, rotary[k.removeprefix("lm.")]) for k, b in mine.items()), f"rank {r}'s rotary buffers"

    # 2. the critic: the checkpoint's trunk, a zero head
    critic = torch.load(Path(tmp_path, "critic.pt"))
    tiny = load_causal_lm(str(tiny_calc_model), dtype=torch.float32).state_dict()
    trunk = {k: v for k, v in critic.items() if k.startswith("trunk.")}
    assert sorted(trunk) == sorted("trunk." + k.removeprefix("model.") for k in tiny if k.startswith("model."))
    assert all(torch.equal(v, tiny["model." + k.removeprefix("trunk.")]) for k, v in trunk.items())
    assert not critic["head.weight"].any() and not critic["head.bias"].any()

    # 3. LoRA: the frozen base and the seeded adapter are the one-rank learner's
    two = torch.load(Path(tmp_path, "lora.pt"))
    one_learner: Learner = make_learner(str(tiny_calc_model), lora=LORA)
    try:
        one = one_learner.full_state_dict()
    finally:
        one_learner.shutdown()
    assert sorted(two) == sorted(one) and any(".lora_A." in k for k in one)
    assert all(torch.equal(two[k], one[k]) for k in one), [k for k in one if not torch.equal(two[k], one[k])]
