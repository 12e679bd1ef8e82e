"""A sequence-classification reward model, served in batches: one scalar score per conversation.

:class:`RewardModelServer` loads ``AutoModelForSequenceClassification`` (one label: the score)
with its tokenizer and answers ``score(items)``. The controller wraps it as a Ray actor; every
rollout worker sends it one request per finished episode. Requests that arrive together are
batched: the first waits up to ``max_wait_ms`` for others (or until ``max_batch_size`` items are
waiting), then all of them go through one padded forward pass, run in a worker thread so that
new requests keep arriving meanwhile.

An item is a text, used as is, or a conversation (a list of ``{"role", "content"}`` messages),
rendered with the reward model's chat template. The score is the model's raw output (a logit:
any real number; the recipe's weight scales it).

:class:`ScriptedRewardModel` is the test double of the seam (``score(items) -> list[float]``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import anyio

from agentrl.errors import ModelError, RewardModelError

__all__ = ["RewardModelServer", "ScriptedRewardModel", "render_item"]

Item = str | list[dict[str, str]]
"""What is scored: a text, or a conversation rendered with the model's chat template."""


def render_item(tokenizer: Any, item: Item) -> str:
    """The text of ``item``: a string as is; a conversation with the tokenizer's chat template
    (without a generation prompt), or ``role: content`` lines when it has none."""
    if isinstance(item, str):
        return item
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(item, tokenize=False, add_generation_prompt=False)
    return "\n".join(f"{m['role']}: {m['content']}" for m in item)


class RewardModelServer:
    """Scores texts or conversations with a sequence-classification model, batching concurrent
    requests.

    ``path``: a Hugging Face folder or hub id of a model with one output label (a classifier
    head that is missing is initialised at random from ``seed``, as transformers does: only
    for tests); ``max_batch_size``: most items in one forward pass; ``max_wait_ms``: how long
    the first waiting item waits for company; ``max_length``: items are cut to this many tokens
    (from the left, keeping the end of the conversation); ``device``: ``cuda`` when a GPU is
    visible, else ``cpu`` (None: chosen so); ``dtype``: of the parameters (float32 on CPU)."""

    def __init__(
        self, path: str, *, max_batch_size: int = 16, max_wait_ms: float = 5.0, max_length: int = 2048,
        device: str | None = None, dtype: str = "float32", torch_threads: int = 1, seed: int = 0,
    ) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification

        from agentrl.models.loading import load_tokenizer

        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cpu":
            torch.set_num_threads(torch_threads)
        self.tokenizer = load_tokenizer(path)
        """Renders and pads the items (padding with EOS when the tokenizer has no pad token)."""
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.tokenizer.truncation_side = "left"
        torch.manual_seed(seed)
        try:
            model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, dtype=getattr(torch, dtype))
        except Exception as exc:
            raise ModelError(f"cannot load the reward model {path!r}: {type(exc).__name__}: {exc}") from exc
        model.config.pad_token_id = self.tokenizer.pad_token_id
        self.model = model.to(device).eval()
        """The classifier: item tokens -> one logit, read at the last token that is not padding."""
        self.device = device
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_ms / 1000.0
        self.max_length = max_length
        self._waiting: list[tuple[Item, asyncio.Future]] = []
        self._batcher: asyncio.Task | None = None
        self.requests = 0
        """Calls of :meth:`score` so far."""
        self.items = 0
        """Items scored so far."""
        self.forwards = 0
        """Forward passes so far (fewer than ``items`` when requests were batched)."""
        self.forward_s = 0.0
        """Seconds spent in forward passes."""

    def ping(self) -> bool:
        """True once the model is loaded (the controller's start-up check)."""
        return True

    def score_now(self, items: list[Item]) -> list[float]:
        """Score ``items`` in one forward pass, now (no batching with other requests)."""
        import torch

        texts = [render_item(self.tokenizer, it) for it in items]
        enc = self.tokenizer(texts, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt",
                             add_special_tokens=False)
        t0 = time.monotonic()
        with torch.inference_mode():
            logits = self.model(input_ids=enc["input_ids"].to(self.device), attention_mask=enc["attention_mask"].to(self.device)).logits
        self.forwards += 1
        self.forward_s += time.monotonic() - t0
        return [float(x) for x in logits[:, 0].float().cpu()]

    async def score(self, items: list[Item]) -> list[float]:
        """One score per item, in order, batched with the other requests waiting now. Raises
        :class:`RewardModelError` when the forward pass fails (bad input, out of memory)."""
        self.requests += 1
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in items]
        self._waiting.extend(zip(items, futures))
        if self._batcher is None or self._batcher.done():
            self._batcher = asyncio.ensure_future(self._drain())
        return list(await asyncio.gather(*futures))

    async def _drain(self) -> None:
        """Run batches while items wait: wait up to ``max_wait_s`` for a full batch, then one
        forward pass (in a worker thread) over at most ``max_batch_size`` items."""
        while self._waiting:
            deadline = time.monotonic() + self.max_wait_s
            while len(self._waiting) < self.max_batch_size and time.monotonic() < deadline:
                await asyncio.sleep(min(0.001, self.max_wait_s))
            batch, self._waiting = self._waiting[: self.max_batch_size], self._waiting[self.max_batch_size:]
            try:
                scores = await anyio.to_thread.run_sync(self.score_now, [it for it, _ in batch])
            except Exception as exc:  # noqa: BLE001 - every request of the batch learns why
                error = RewardModelError(f"reward model: the forward pass failed: {type(exc).__name__}: {exc}")
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(error)
                continue
            self.items += len(batch)
            for (_, fut), s in zip(batch, scores):
                if not fut.done():  # a request cancelled by its caller's timeout
                    fut.set_result(s)

    def stats(self) -> dict[str, Any]:
        """Counters: ``requests``, ``items``, ``forwards``, ``forward_s``."""
        return {"requests": self.requests, "items": self.items, "forwards": self.forwards, "forward_s": self.forward_s}

    async def shutdown(self) -> None:
        """Stop batching; requests still waiting fail."""
        if self._batcher is not None and not self._batcher.done():
            self._batcher.cancel()
        for _, fut in self._waiting:
            if not fut.done():
                fut.set_exception(RewardModelError("reward model: shut down"))
        self._waiting = []


class ScriptedRewardModel:
    """The test double of :class:`RewardModelServer`: ``score(items)`` answers
    ``script(item)`` for each item after ``delay_s`` seconds (raising what ``script`` raises);
    ``calls`` records the items of every call."""

    def __init__(self, script: Callable[[Item], float], *, delay_s: float = 0.0) -> None:
        self.script = script
        self.delay_s = delay_s
        self.calls: list[list[Item]] = []

    async def score(self, items: list[Item]) -> list[float]:
        self.calls.append(list(items))
        await anyio.sleep(self.delay_s)
        return [float(self.script(it)) for it in items]
