"""The run around training: held-out evaluation, placement, checkpoints, Weights & Biases, and Ray.

Sections of the recipe (:class:`agentrl.config.Recipe`); import them from :mod:`agentrl.config`."""

from __future__ import annotations

import re

from typing import Literal

from pydantic import Field, model_validator

from agentrl.recipe.section import Section

__all__ = ["EvalSetConfig", "EvalConfig", "PlacementConfig", "CheckpointConfig", "WandbConfig", "RayConfig"]


class EvalSetConfig(Section):
    """A further held-out set evaluated beside the main one (``[eval.sets.NAME]``), e.g. problems
    from templates or ranges training never sees; its metrics are logged as ``NAME/accuracy``..."""

    source: str
    """Its dataset (same forms as ``data.source``), e.g. ``"synthetic:math_ood"``."""
    fields: dict[str, str] | None = None
    """Column mapping of ``source``; None = ``eval.fields``, else ``data.fields``."""
    split: str = "test"
    """Split of ``source``."""
    limit: int | None = Field(None, gt=0)
    """Rows to evaluate on; None = ``eval.limit``."""


class EvalConfig(Section):
    """Held-out evaluation before and after RL (and every ``every_steps``)."""

    limit: int = Field(0, ge=0)
    """Held-out rows to evaluate on; 0 = no evaluation."""
    source: str | None = None
    """Evaluation dataset (same forms as ``data.source``); None = ``data.source``."""
    fields: dict[str, str] | None = None
    """Column mapping of ``source``; None = ``data.fields``."""
    split: str = "test"
    """Split of the evaluation dataset (synthetic sources draw different problems per split)."""
    temperature: float = Field(0.0, ge=0)
    """Sampling temperature of evaluation episodes (0 = greedy)."""
    every_steps: int = Field(0, ge=0)
    """Also evaluate every this many learner steps; 0 = only before and after."""
    timeout_s: float = Field(900.0, gt=0)
    """Longest wait for one evaluation, seconds."""
    samples: int = Field(4, ge=0)
    """Episodes of each evaluation written, decoded, to ``eval_samples.jsonl`` (the report's
    trajectory browser; ``agentrl eval --show N`` prints N of them)."""
    sets: dict[str, EvalSetConfig] = Field(default_factory=dict)
    """Further held-out sets by name (``[eval.sets.ood] source = "synthetic:math_ood"``), played
    at every evaluation with the same weights; the main set's numbers stay unprefixed."""

    @model_validator(mode="after")
    def _set_names(self) -> "EvalConfig":
        for name in self.sets:
            if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
                raise ValueError(f"eval.sets: set name {name!r} must be lower-case letters, digits and '_', starting with a letter")
        return self


class PlacementConfig(Section):
    """Where generation and training run (:mod:`agentrl.placement_plan`)."""

    mode: Literal["auto", "separate", "colocated"] = "auto"
    """``separate``: generators and learner ranks on devices of their own, running at the same
    time (training on samples up to ``algo.max_staleness`` versions old). ``colocated``: they
    share the same devices and take turns, each phase with all of them (on-policy: the staleness
    bound in force is 0). ``auto``: colocated when both sides would share devices (one machine
    without GPUs, or too few GPUs to hold them apart), separate otherwise; the run's first lines
    say which and why."""
    gpu_memory_gib: float | None = Field(None, gt=0)
    """Memory of one GPU, GiB, for planning a colocated GPU run on a machine without that GPU
    (``agentrl check --dry-run``); None: read from the device when the run starts."""
    gpus_per_node: int | None = Field(None, ge=0)
    """GPUs of the machine the dry run plans for (None: this machine's)."""


class CheckpointConfig(Section):
    """Resumable checkpoints (learner state, weights, queue, dataset cursor together)."""

    every_minutes: float = Field(10.0, ge=0, allow_inf_nan=False)
    """Write a checkpoint after the first learner step that ends at least this many minutes after
    the previous checkpoint (or the start of RL); 0 = none by time. With ``first_step`` and
    ``at_eval`` this default makes every run resumable and its learner restartable (failover)."""
    first_step: bool = True
    """Also write a checkpoint right after learner step 1, so that a learner that dies early is
    restarted from it instead of ending the run."""
    at_eval: bool = True
    """Also write a checkpoint at every mid-run evaluation (``eval.every_steps``)."""
    every_steps: int = Field(0, ge=0)
    """Also write a checkpoint every this many learner steps; 0 = not by step count."""
    keep: int = Field(2, gt=0)
    """Complete checkpoints kept on disk."""
    background: bool = True
    """The learner (and critic) ranks copy their state to host memory and write it in a thread
    while training goes on; the checkpoint appears in ``checkpoints/`` after the next learner step
    (or when the run stops). Costs a second copy of the weights and optimizer state in host
    memory while it is written (about 12 bytes a trained parameter with AdamW in float32);
    false: training waits for the write."""
    resume: bool = True
    """Resume from the newest checkpoint in the run directory when there is one (``agentrl train
    --fresh`` starts over instead, keeping the old run beside it)."""


class WandbConfig(Section):
    """Weights & Biases logging of every metric record (off unless ``project`` is set; needs
    ``pip install wandb``). JSONL and TensorBoard are written either way."""

    project: str | None = None
    """W&B project; None = no W&B."""
    entity: str | None = None
    """W&B entity (user or team); None = the account's default."""
    name: str | None = None
    """Run name; None = the recipe's ``name``."""
    mode: Literal["online", "offline"] = "online"
    """``online`` streams to the W&B server (needs ``WANDB_API_KEY`` or ``wandb login``);
    ``offline`` writes the run under the run directory for a later ``wandb sync``."""
    tags: list[str] = []
    """Run tags."""


class RayConfig(Section):
    """Where the actors run."""

    address: str | None = None
    """``None`` starts a local Ray instance; ``auto`` or ``host:port`` joins an existing cluster."""
    num_cpus: int | None = Field(None, gt=0)
    """Logical CPUs of the local instance (default: enough for the recipe's actors)."""
