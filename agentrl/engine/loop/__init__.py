"""The RL loop and what it keeps: the prompt ledger, the staleness queue, batching, the critic
and SFT stages, weight publishing, checkpointing, learner failover, evaluation and the
degenerate-step diagnosis.

Imports :mod:`agentrl.engine.common`, :mod:`agentrl.engine.generation` and
:mod:`agentrl.engine.training` (it drives the fleet and the learner group).
"""
