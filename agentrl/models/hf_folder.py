"""Writing a model as a Hugging Face folder: the one format of published weight versions,
SFT and final models, and checkpoint exports (transformers and vLLM load it unchanged).

Used by the learner and by :mod:`agentrl.engine.training.checkpoint`; it imports nothing of agentrl.
"""

from __future__ import annotations

import copy
import os
import shutil
from pathlib import Path
from typing import Any

import torch

__all__ = ["write_hf_folder"]


def write_hf_folder(
    state_dict: dict[str, torch.Tensor],
    config: Any,
    out_dir: Path,
    tokenizer: Any = None,
    generation_config: Any = None,
    dtype: torch.dtype | None = None,
) -> Path:
    """Write a Hugging Face model folder atomically (a temporary sibling renamed into place).

    Tied output embeddings (``config.tie_word_embeddings``) are written once, as transformers
    and vLLM expect. ``dtype`` (when given) casts floating-point tensors and the config's
    ``dtype`` to it: a bfloat16 run publishes bfloat16 versions (half the bytes of the float32
    master weights; vLLM would round them to bfloat16 on load anyway). The config always says
    ``use_cache: true``: the learner turns the KV cache off for training, a user's ``generate``
    wants it. ``generation_config`` (when given) is written too: instruct models keep their
    end-of-turn EOS ids there (Qwen2.5's ``<|im_end|>`` is not ``config.eos_token_id``), and a
    server without it would not stop at the end of a turn. Readers never see a half-written
    folder.
    """
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    tensors = {
        k: v.detach().to("cpu", dtype if dtype is not None and v.is_floating_point() else v.dtype).contiguous()
        for k, v in state_dict.items()
    }  # no copy for tensors already on the CPU in that dtype (the learner's gathered state dict)
    config = copy.deepcopy(config)
    config.use_cache = True  # an inference setting: the learner trains with the KV cache off
    if dtype is not None:
        config.dtype = dtype
    if getattr(config, "tie_word_embeddings", False):
        tensors.pop("lm_head.weight", None)
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(tmp)
    if generation_config is not None:
        generation_config.save_pretrained(tmp)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)
    return out_dir
