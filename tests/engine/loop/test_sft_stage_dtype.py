"""The SFT stage writes its model in the recipe's model dtype (the learner's serving dtype:
bfloat16 on GPUs), not the float32 master weights: the learner ranks are in-process doubles
that write a folder stating the dtype they were asked for (the real learner's ``publish`` casts
shard by shard before the gather: tests/engine/generation/test_weight_transfer_gpu_seams.py)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from agentrl.engine.loop import sft_stage
from agentrl.engine.testing import local_actor
from agentrl.engine.training.learner_group import LearnerGroup


class SftLearner:
    """A learner rank as the SFT stage drives it; ``publish`` writes ``config.json`` with the
    dtype it would write the weights in."""

    def __init__(self, dtype: str) -> None:
        self.dtype = dtype

    def setup(self) -> dict[str, Any]:
        return {}

    def sft_step(self, batch: list[Any]) -> dict[str, Any]:
        return {"sft_loss": 1.0, "lr": 1e-5, "trained_tokens": 4.0}

    def publish(self, out_dir: str, with_tokenizer: bool = False, serving_dtype: bool = False, merged: bool = False) -> str:
        Path(out_dir).mkdir(parents=True)
        (Path(out_dir) / "config.json").write_text(json.dumps({"torch_dtype": self.dtype if serving_dtype else "float32"}))
        return out_dir

    def shutdown(self) -> None:
        return None


class Log:
    class console:  # noqa: N801 - the MetricsLogger's attribute
        @staticmethod
        def print(text: str) -> None:
            return None

    def event(self, text: str) -> None:
        return None

    def log(self, kind: str, **record: Any) -> dict[str, Any]:
        return {"time": 0.0, **record}


def test_the_sft_model_is_written_in_the_model_dtype_not_float32(monkeypatch, tmp_path):
    import agentrl.models.loading as loading

    monkeypatch.setattr(loading, "load_tokenizer", lambda name: None)
    monkeypatch.setattr(sft_stage, "load_conversations", lambda source, n, seed: [{"messages": []}] * n)
    monkeypatch.setattr(sft_stage, "encode_chat", lambda tok, c: {"tokens": [1, 2], "loss_mask": [0, 1]})
    learners = LearnerGroup(num_ranks=1, placement=None, timeout_s=30.0,
                            factory=lambda rank, kwargs, options: local_actor(SftLearner("bfloat16"), f"learner {rank}"))
    out = tmp_path / "sft"
    written = asyncio.run(sft_stage.run_sft(learners, {}, model="m", out=out, source="s", num_examples=4, steps=2,
                                            batch_size=2, seed=0, log=Log()))
    assert written == str(out)
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16", "the SFT model was written in float32"
