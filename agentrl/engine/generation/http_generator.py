"""A generator backed by a vLLM server the user runs elsewhere, over HTTP (httpx).

Implements :class:`~agentrl.engine.common.interfaces.Generator`, like :class:`~agentrl.engine.generation.generator.VllmGenerator` (``start``, ``generate``,
``update_weights``, ``stats``, ``shutdown``), so the controller and rollout workers treat both
alike. Token ids go in and come out: vLLM's token-in/token-out endpoint
(``POST /inference/v1/generate``) returns the sampled token ids, their log-probabilities and the
weight-version spans; nothing is re-tokenised. Weight updates use vLLM's RL endpoints the way
the in-process generator uses the engine: ``/pause?mode=keep`` → ``/collective_rpc``
``reload_weights`` → ``/update_weight_version`` → ``/resume``, so requests in flight survive.

The server must be started with both switches, and must see the run directory's ``weights/``
folder at the same path (a shared filesystem). ``--logprobs-mode processed_logprobs`` makes its
log-probs those of the distribution it samples from (after temperature), which the learner
computes too; without it they are of the raw logits, and importance weights at a temperature
other than 1 compare different distributions::

    VLLM_SERVER_DEV_MODE=1 vllm serve MODEL --enable-scale-out --logprobs-mode processed_logprobs --max-model-len 4096

A model with tied input/output embeddings (SmolLM2, Qwen2.5 up to 3B...) also needs agentrl's
worker methods in the server (agentrl installed there), or a reloaded version would keep its old
output projection (:mod:`agentrl.engine.generation.vllm_worker`)::

    ... --worker-extension-cls agentrl.engine.generation.vllm_worker.WorkerExtension
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx

from agentrl.engine.generation.generator import GeneratorCounters, versions_from_spans
from agentrl.engine.common.interfaces import Generation, Generator
from agentrl.engine.generation.vllm_worker import RETIE_METHOD, WORKER_EXTENSION
from agentrl.errors import GeneratorError

__all__ = ["HttpGenerator"]


def _ties_embeddings(folder: str) -> bool:
    """Whether the Hugging Face model in ``folder`` ties its output projection to its input
    embedding (read from its config.json; False when there is none to read)."""
    import json

    try:
        config = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    text = config.get("text_config") or config
    return bool(text.get("tie_word_embeddings", config.get("tie_word_embeddings", False)))


class HttpGenerator(GeneratorCounters, Generator):
    """One remote vLLM server at ``url`` (e.g. ``http://gpu-node-3:8000``).

    ``timeout_s`` bounds every call (a generation, a weight update); ``version`` labels the
    weights the server holds when this client starts."""

    def __init__(
        self, url: str, *, timeout_s: float = 300.0, version: int = 0, load: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        """``load``: a weights folder the server loads (as ``version``) at :meth:`start`, for a
        client that replaces one that failed mid-run; ``transport``: an httpx transport (tests)."""
        super().__init__(version)
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.load = load
        self._client: httpx.AsyncClient | None = None
        self._transport = transport

    async def _post(self, path: str, *, json: Any = None, params: dict[str, Any] | None = None) -> Any:
        assert self._client is not None
        try:
            r = await self._client.post(path, json=json, params=params)
        except httpx.HTTPError as exc:
            raise GeneratorError(f"{self.url}{path}: {type(exc).__name__}: {exc}") from exc
        if r.status_code != 200:
            raise GeneratorError(f"{self.url}{path} answered {r.status_code}: {r.text[:500]}")
        try:
            return r.json() if r.content else None
        except ValueError as exc:
            raise GeneratorError(f"{self.url}{path}: the answer is not JSON: {r.text[:300]}") from exc

    async def start(self) -> dict[str, Any]:
        """Check that the server answers and offers the endpoints used here."""
        self._client = httpx.AsyncClient(
            base_url=self.url, timeout=httpx.Timeout(self.timeout_s, connect=30.0), transport=self._transport
        )
        t0 = time.monotonic()
        try:
            health = await self._client.get("/health")
            info = await self._client.get("/weight_info")
        except httpx.HTTPError as exc:
            raise GeneratorError(f"vLLM server {self.url} does not answer: {type(exc).__name__}: {exc}") from exc
        if health.status_code != 200:
            raise GeneratorError(f"vLLM server {self.url} is not healthy ({health.status_code})")
        if info.status_code == 404:
            raise GeneratorError(
                f"vLLM server {self.url} has no RL endpoints: start it with VLLM_SERVER_DEV_MODE=1 "
                "and --enable-scale-out"
            )
        if self.load is not None:
            await self.update_weights(self.version, self.load)
        else:
            await self._post("/update_weight_version", json={"new_version": str(self.version)})
        return {"startup_s": time.monotonic() - t0, "device": "remote", "url": self.url}

    async def generate(self, prompt_token_ids: list[int], sampling: dict[str, Any]) -> Generation:
        """Sample a continuation of ``prompt_token_ids`` (``sampling``: ``vllm.SamplingParams``
        keyword arguments, as for the in-process generator)."""
        if self._client is None:
            raise GeneratorError("generator not started")
        body = {
            "token_ids": list(prompt_token_ids),
            "sampling_params": {**sampling, "logprobs": 0, "include_stop_str_in_output": True, "skip_special_tokens": False},
            "output_mode": "tokens",
        }
        with self.busy:
            out = await self._post("/inference/v1/generate", json=body)
        try:
            choice = out["choices"][0]
            ids = [int(t) for t in choice["token_ids"]]
            lps = [float(c["logprob"]) for c in (choice.get("logprobs") or {}).get("content") or []]
            spans = [(s["version"], s["start"], s["end"]) for s in choice.get("weight_versions") or []]
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise GeneratorError(f"{self.url}: unexpected generate response ({exc}): {str(out)[:300]}") from exc
        if len(lps) != len(ids):
            raise GeneratorError(f"{self.url}: {len(ids)} tokens but {len(lps)} logprobs")
        self.tokens_generated += len(ids)
        return Generation(ids, lps, versions_from_spans(spans, len(ids), self.version), choice.get("finish_reason") or "abort", choice.get("stop_reason"))

    async def update_weights(self, version: int, path: str) -> float:
        """Make the server load the Hugging Face folder ``path`` as ``version`` with requests in
        flight kept; returns the stall in seconds."""
        if self._client is None:
            raise GeneratorError("generator not started")
        t0 = time.monotonic()
        await self._post("/pause", params={"mode": "keep"})
        try:
            # the server resolves paths in its own working directory: send an absolute one
            weights = str(Path(path).resolve())
            await self._post("/collective_rpc", json={"method": "reload_weights", "kwargs": {"weights_path": weights}})
            if _ties_embeddings(weights):
                try:
                    await self._post("/collective_rpc", json={"method": RETIE_METHOD})
                except GeneratorError as exc:
                    raise GeneratorError(
                        f"{self.url}: this model ties its output projection to its embeddings, and the server "
                        f"cannot re-tie it after a reload; start it with --worker-extension-cls {WORKER_EXTENSION} "
                        f"(agentrl installed on the server) ({exc})"
                    ) from exc
            await self._post("/update_weight_version", json={"new_version": str(version)})
        finally:
            await self._post("/resume")
        self.version = version
        stall = time.monotonic() - t0
        self.update_stalls_s.append(stall)
        return stall

    async def shutdown(self) -> None:
        """Close the connection pool (the server keeps running: it is not ours)."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None
