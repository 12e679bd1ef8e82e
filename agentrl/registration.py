"""The built-in environments' Gymnasium ids, registered when ``agentrl`` is imported.

Registration stores entry-point strings only: nothing of the environments (nor torch, vLLM or
Ray) is imported until an environment is made. So both Gymnasium forms work in a fresh
interpreter::

    import agentrl, gymnasium as gym
    env = gym.make("agentrl/Calc-v0")

    import gymnasium as gym
    env = gym.make("agentrl:agentrl/Calc-v0")   # Gymnasium imports ``agentrl`` first
"""

from __future__ import annotations

__all__ = ["BUILTIN_ENVS", "register_builtin_envs"]

BUILTIN_ENVS: dict[str, str] = {
    "agentrl/Calc-v0": "agentrl.envs.calc:CalcEnv",
    "agentrl/MathTool-v0": "agentrl.envs.math_envs:MathToolEnv",
    "agentrl/Math-v0": "agentrl.envs.math_envs:MathEnv",
    "agentrl/Turns-v0": "agentrl.envs.turns:TurnsEnv",
}
"""Environment ids and their entry points (``module:Class``)."""


def register_builtin_envs() -> None:
    """Register :data:`BUILTIN_ENVS` with Gymnasium (ids already registered are left alone)."""
    import gymnasium

    for env_id, entry_point in BUILTIN_ENVS.items():
        if env_id not in gymnasium.registry:
            gymnasium.register(id=env_id, entry_point=entry_point)
