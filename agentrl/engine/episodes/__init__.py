"""Episodes: the rollout worker that plays them (its router, episode runner and scoring bundle;
environments, sandboxes, agents), the agent gateway and its OpenAI wire format, chat segments and
their exact token sequences, incremental rendering with the chat template, and stop strings.

Imports :mod:`agentrl.engine.common` and :mod:`agentrl.engine.rewards` (scoring a finished
episode).
"""
