"""The recipe's sections, one module per part of a run; :mod:`agentrl.config` joins them into
:class:`~agentrl.config.Recipe` (with the rules that span sections), reads TOML files and applies
``--set`` overrides, and re-exports every section: import them from :mod:`agentrl.config`.

- :mod:`~agentrl.recipe.section`: the base every section derives from;
- :mod:`~agentrl.recipe.model`: model, data, environment, sandbox;
- :mod:`~agentrl.recipe.generation`: generators and rollout;
- :mod:`~agentrl.recipe.training`: learner, algorithm, critic, SFT, LoRA;
- :mod:`~agentrl.recipe.rewards`: judge, reward model, reward functions;
- :mod:`~agentrl.recipe.run`: evaluation, placement, checkpoints, W&B, Ray.

Like :mod:`agentrl.config`, nothing here imports the engine.
"""
