"""Rewards beyond the environment's rules: the LLM judge, the reward-model server and its actor,
and the scorer that combines them with the environment's reward.

Imports only :mod:`agentrl.engine.common`.
"""
