"""Training: one FSDP rank base (``fsdp_rank``) with the learner and the critic as its two kinds,
micro-batching, chunked log-probs, LoRA, weight export and sending, training checkpoints, the
SFT data, the learner group of Ray actors, its placement and each rank's device.

Imports :mod:`agentrl.engine.common` and :mod:`agentrl.engine.generation` (the weight-transfer
engine the learner sends through).
"""
