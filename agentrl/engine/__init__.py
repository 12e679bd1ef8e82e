"""The RL engine, in wings (docs/architecture.md is the map; ``tests/test_imports.py`` checks
which wing may import which):

- :mod:`~agentrl.engine.common`: what every wing shares (trajectory, generator protocol, Ray,
  waits, run directory...); imports no other wing;
- :mod:`~agentrl.engine.generation`: the generators, their fleet, weight transfer;
- :mod:`~agentrl.engine.training`: the FSDP ranks (learner, critic) and their group;
- :mod:`~agentrl.engine.rewards`: judge, reward model, reward functions, scoring;
- :mod:`~agentrl.engine.episodes`: the rollout worker and the episodes it plays;
- :mod:`~agentrl.engine.loop`: the RL loop and what it keeps (ledger, staleness queue,
  publishing, checkpoints, failover, evaluation).

The run's plumbing sits on top (``engine/*.py``): the controller orders the stages, the assembly
builds the parts from the recipe, wiring turns recipe sections into plain arguments.
"""
