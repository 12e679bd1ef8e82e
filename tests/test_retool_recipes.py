"""ReTool on a laptop's two recipes are the same run but for the tool (issue 38): the same model,
SFT budget, RL steps, episodes per step, evaluation and seed. What may differ is listed here."""

from __future__ import annotations

from pathlib import Path

from agentrl.config import load_recipe

REPO = Path(__file__).resolve().parents[1]

ALLOWED = {
    "name",
    "sft.source",  # demonstrations in each format (agentrl.envs.math_demos)
    "env.id", "env.kwargs",  # MathTool-v0 (turns, tool calls) against Math-v0
    "rollout.stop",  # the tool arm stops at </code> to run the block
    "rollout.max_new_tokens",  # the text arm's one turn holds its longest worked solution
}


def _flat(d: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and key not in ALLOWED:
            out.update(_flat(v, key + "."))
        else:
            out[key] = v
    return out


def test_the_tool_and_text_recipes_differ_only_in_the_tool():
    tool = _flat(load_recipe(REPO / "recipes" / "smol_retool.toml").model_dump(mode="json"))
    text = _flat(load_recipe(REPO / "recipes" / "smol_math_text.toml").model_dump(mode="json"))
    differ = {k for k in tool.keys() | text.keys() if tool.get(k) != text.get(k)}
    assert differ <= ALLOWED, sorted(differ - ALLOWED)
    assert {"sft.source", "env.id"} <= differ  # they are two arms, not one
    # the tool arm's episode may not generate less than the text arm's one turn
    assert tool["env.kwargs"]["max_turns"] * tool["rollout.max_new_tokens"] >= text["rollout.max_new_tokens"]
