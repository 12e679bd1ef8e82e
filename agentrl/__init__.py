"""agentrl: asynchronous, off-policy RL for language models acting in multi-turn, tool-calling
environments. Importing it registers the built-in Gymnasium environments
(:mod:`agentrl.registration`: ids only, no heavy import)."""

from agentrl.registration import register_builtin_envs

register_builtin_envs()
