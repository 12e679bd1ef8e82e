"""Methods agentrl adds to every vLLM worker (``worker_extension_cls``, vLLM's supported way to
extend its workers; nothing of vLLM is patched).

Why: a model with tied input/output embeddings (SmolLM2, Qwen2.5 up to 3B, Llama 3.2, Gemma)
has one weight matrix that vLLM uses twice, as the embedding and as the output projection
(``lm_head``). A weight reload (disk versions: ``reload_weights``; collective versions: the
weight-transfer engine) loads the embedding and re-processes the layers it loaded, but the tied
``lm_head`` loads nothing of its own, so whatever its kernel derived from the old matrix stays:
on CPU, the oneDNN handle packed from the old weights; elsewhere, the old tensor itself when the
reload gave the embedding a new one. Tokens would then be sampled from the old output
projection on top of the new body. :meth:`WorkerExtension.agentrl_retie_output_embeddings`,
called after every update while generation is still paused, points ``lm_head`` at the current
embedding again and re-runs its post-load processing.

Importing this module in a worker also drops one misleading vLLM warning,
``RotaryEmbedding: Failed to load weights``, printed at every weight reload
(:class:`RotaryCacheReloadFilter`). Nothing fails to load: a rotary embedding has no weights, only
its ``cos_sin_cache`` buffer, computed from the model's config and never in a checkpoint. vLLM's
layer-wise reload counts that buffer as loadable, finds nothing for it in the new weights, and puts
the layer's own tensor back, which is the right value. Tests that compare vLLM's log-probs after an
update with the learner's (``tests/engine/training/test_learner_vllm.py``) show that every weight is
reloaded.
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["WORKER_EXTENSION", "RETIE_METHOD", "THREADS_METHOD", "RotaryCacheReloadFilter", "WorkerExtension"]


class RotaryCacheReloadFilter(logging.Filter):
    """Drops vLLM's ``RotaryEmbedding: Failed to load weights`` record (see the module docstring);
    every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.getMessage() == "RotaryEmbedding: Failed to load weights")


logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").addFilter(RotaryCacheReloadFilter())

WORKER_EXTENSION = "agentrl.engine.generation.vllm_worker.WorkerExtension"
"""The qualified name vLLM's ``worker_extension_cls`` takes (``--worker-extension-cls`` for a
server)."""

RETIE_METHOD = "agentrl_retie_output_embeddings"
"""The ``collective_rpc`` method name of :meth:`WorkerExtension.agentrl_retie_output_embeddings`."""
THREADS_METHOD = "agentrl_compute_threads"
"""The ``collective_rpc`` method name of :meth:`WorkerExtension.agentrl_compute_threads`."""


class WorkerExtension:
    """Mixed into vLLM's worker class by vLLM itself (``self`` is the worker)."""

    def agentrl_retie_output_embeddings(self) -> bool:
        """If the served model ties its output projection to its input embedding, make the
        projection use the embedding's current weights again (and redo its kernel set-up).
        Returns whether the model is tied (False: nothing to do)."""
        worker: Any = self
        model = worker.model_runner.get_model()
        hf_config = worker.model_runner.model_config.hf_text_config
        lm_head = getattr(model, "lm_head", None)
        inner = getattr(model, "model", None)
        embed = getattr(inner, "embed_tokens", None) if inner is not None else None
        if not getattr(hf_config, "tie_word_embeddings", False) or lm_head is None or embed is None:
            return False
        lm_head.weight = embed.weight
        method = getattr(lm_head, "quant_method", None)
        if method is not None and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(lm_head)
        return True

    def agentrl_compute_threads(self) -> int:
        """The torch threads this worker computes with (on CPU, what its OpenMP set-up gave it)."""
        import torch

        return torch.get_num_threads()
