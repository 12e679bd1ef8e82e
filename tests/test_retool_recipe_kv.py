"""The shipped 8-GPU ReTool recipe keeps the KV cache at weight updates (issue 35, item 8): the
default drops it, which there preempts up to 256 requests per engine at every update and
re-prefills contexts of up to 16k tokens. The choice is written in the recipe itself (with its
reason beside it), not left to the default."""

from __future__ import annotations

import tomllib
from pathlib import Path

from agentrl.config import load_recipe

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "retool_math.toml"


def test_the_retool_recipe_keeps_the_kv_cache_at_updates_explicitly():
    raw = tomllib.loads(RECIPE.read_text())
    assert raw["generator"].get("recompute_kv_on_update") is False, "retool_math.toml must set recompute_kv_on_update = false itself"
    recipe = load_recipe(RECIPE)
    assert recipe.generator.recompute_kv_on_update is False
    # what the choice costs is said where it is made
    text = RECIPE.read_text()
    reason = text[: text.index("recompute_kv_on_update = false")].rsplit("timeout_s = 1200.0", 1)[1]
    assert "behaviour log-probs" in reason and "label" in reason
