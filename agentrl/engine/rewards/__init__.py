"""Rewards beyond the environment's rules: the LLM judge, the reward-model server, the user's
reward functions, the scorer that combines them with the environment's reward, a rollout
worker's scoring bundle, and the reward actors (a separate judge's generators, the reward
model), started and replaced in-run.

Imports only :mod:`agentrl.engine.common`.
"""
