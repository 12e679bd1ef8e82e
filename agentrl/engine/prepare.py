"""The model a run starts from: a folder or hub id, built (``[model] build``) or imported
(``[model] import``) on first use."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentrl.config import Recipe
from agentrl.model_plan import plan_model

__all__ = ["prepare_model"]


def prepare_model(recipe: Recipe, rows: list[dict[str, Any]], log: Any = None) -> str:
    """Return the model to load; first build a tiny one (``[model] build``) or import a GGUF one
    (``[model] import``, in float32 whatever ``model.dtype`` is) there when the recipe asks and
    ``model.path`` is missing or empty."""
    path = Path(recipe.model.path).absolute()  # actors on other nodes do not share our working directory
    plan = plan_model(recipe.model.path, recipe.model.build, recipe.model.import_)
    if plan.action == "use":
        return str(path) if path.is_dir() else recipe.model.path  # else a hub id
    if plan.action == "import":
        from agentrl.models.importing import import_model

        # float32 whatever the run computes in: the GGUF's dequantised weights exactly, so a folder
        # imported once starts a float32 run and a bfloat16 one (float32 master weights under
        # mixed precision) alike; vLLM casts to the run's dtype as it loads.
        if log:
            log.event(f"importing {recipe.model.import_} to {path} (float32)")
        import_model(recipe.model.import_, path, dtype="float32", overwrite=True)
        return str(path)
    from agentrl.envs.corpus import tokenizer_corpus
    from agentrl.models.tiny import TinyModelSpec, build_tiny_model

    spec = TinyModelSpec(**recipe.model.tiny.model_dump())
    texts = tokenizer_corpus(recipe.env.agent or recipe.env.id, rows, seed=recipe.model.tiny.seed)
    if log:
        log.event(f"building tiny model at {path} ({len(texts)} tokenizer texts)")
    build_tiny_model(path, texts, spec)
    return str(path)
