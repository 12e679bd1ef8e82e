"""The supervised warm-up stage: the learner ranks on demonstrations, before RL."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any

from agentrl.engine.training.learner_group import LearnerGroup
from agentrl.engine.training.sft import encode_chat, load_conversations
from agentrl.errors import LearnerDied

__all__ = ["run_sft"]


async def run_sft(
    learners: LearnerGroup, learner_kwargs: dict[str, Any], *, model: str, out: Path, source: str, num_examples: int,
    steps: int, batch_size: int, seed: int, log: Any, max_restarts: int = 0,
) -> str:
    """Train ``steps`` steps of ``batch_size`` conversations drawn from ``num_examples`` of
    ``source`` on ``model``; write the result to ``out`` (in the learner's model dtype, the
    recipe's ``model.dtype``) and return it. ``out`` already holding a
    model (a resumed run) skips the stage. ``learners`` is started with ``learner_kwargs`` and
    stopped at the end; ``log`` is a MetricsLogger. A learner rank that dies during the stage is
    restarted and the stage begins again from ``model`` (the same batches: the stage keeps no
    checkpoint), at most ``max_restarts`` times, each said in one event; past that the death
    propagates."""
    from agentrl.models.loading import load_tokenizer

    if (out / "config.json").exists():
        log.event(f"SFT stage already done: {out}")
        return str(out)
    tok = load_tokenizer(model)
    # In a thread: a source function may run an event loop of its own (anyio.run), and a slow one
    # must not stall this loop's timers.
    conversations = await asyncio.to_thread(load_conversations, source, num_examples, seed)
    samples = [encode_chat(tok, c) for c in conversations]
    log.event(f"SFT: {steps} steps x {batch_size} of {len(samples)} conversations from {source}")
    t0 = time.monotonic()
    restarts = 0
    while True:
        try:
            await learners.start(learner_kwargs, what="SFT learner set-up")
            await _train(learners, samples, steps=steps, batch_size=batch_size, seed=seed, log=log)
            break
        except LearnerDied as died:
            if restarts >= max_restarts:
                raise
            restarts += 1
            learners.kill()
            log.event(f"{died}; restarting the SFT stage from {model} at step 0 (restart {restarts} of {max_restarts})",
                      learner_restarts=1)
    # a LoRA warm-up is written merged: RL starts from a whole model (with a fresh adapter). In
    # the recipe's model dtype (bfloat16 on GPUs), cast shard by shard before the gather, as the
    # generators serve it: a float32 copy of a 7B model would be 30 GB gathered, written and read
    await learners.call("publish", str(out), True, serving_dtype=True, merged=True, what="writing the SFT model")
    await learners.stop()
    log.event(f"SFT done in {time.monotonic() - t0:.0f} s: {out}")
    return str(out)


async def _train(learners: LearnerGroup, samples: list[dict[str, Any]], *, steps: int, batch_size: int, seed: int, log: Any) -> None:
    """The stage's ``steps`` steps, from step 1 (the batches drawn with ``seed``)."""
    rng = random.Random(seed)
    t0 = time.monotonic()
    tokens = 0.0
    for step in range(1, steps + 1):
        batch = rng.sample(samples, min(batch_size, len(samples)))
        res = await learners.call("sft_step", batch, what=f"SFT step {step}")
        tokens += res[0]["trained_tokens"]
        if step % 25 == 0 or step == steps:
            m = res[0]
            rec = log.log("sft", step=step, **m, elapsed_s=time.monotonic() - t0)
            log.console.print(
                f"sft {int(step):>5}/{int(steps)}  loss {m['sft_loss']:.4f}  lr {m['lr']:.2e}  "
                f"{tokens / max(1e-9, time.monotonic() - t0):.0f} trained tok/s  t={rec['time']:.0f}s"
            )
