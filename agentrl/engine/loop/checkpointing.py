"""Writing a resumable run checkpoint: the learner's state (every rank), the critic's (PPO with
GAE), the weights of the checkpoint's version and the run state, into ``checkpoints/step_NNNNNN/`` atomically.

The folder's format (and reading it back) is :mod:`agentrl.engine.loop.run_state`'s.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path

from agentrl.engine.generation.fleet import EventLog
from agentrl.engine.training.learner_group import LearnerGroup
from agentrl.engine.common.run_dir import RunDir
from agentrl.engine.loop.run_state import (
    RunState,
    link_tree,
    prune_checkpoints,
    write_checkpoint_state,
)

__all__ = ["RunCheckpointer"]


class RunCheckpointer:
    """Writes checkpoints of a run; keeps the newest ``keep``.

    ``tokenizer``: the folder or hub id the run's tokenizer is read from (saved into each
    checkpoint's weights, so a checkpoint is self-contained; None saves none). ``critic``: PPO's
    critic group, saved into ``critic/`` (None: no critic)."""

    def __init__(
        self, *, run_dir: RunDir, learners: LearnerGroup, keep: int, tokenizer: str | None, log: EventLog,
        critic: LearnerGroup | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.learners = learners
        self.critic = critic
        self.keep = keep
        self.tokenizer = tokenizer
        self.log = log

    def _add_tokenizer(self, exported: Path, weights: Path) -> None:
        """Put the run's tokenizer beside the checkpoint's weights: the files the learner's
        export already wrote (``exported``: its config and tokenizer, saved with the same
        tokenizer), copied where ``weights`` lacks them; otherwise loaded and saved here (which
        imports transformers in this process: seconds, the first time)."""
        if (exported / "tokenizer_config.json").is_file():
            for f in exported.iterdir():
                if f.is_file() and not (weights / f.name).exists():  # the weights' own config and linked files stay
                    shutil.copy2(f, weights / f.name)
            return
        from agentrl.models.loading import load_tokenizer

        load_tokenizer(self.tokenizer).save_pretrained(weights)

    async def save(self, state: RunState) -> Path:
        """Write ``checkpoints/step_N`` for ``state`` (N = ``state.version``); its folder."""
        root = self.run_dir.checkpoints
        final = self.run_dir.checkpoint(state.version)
        tmp = root / f".{final.name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        t0 = time.monotonic()
        await self.learners.call("save_checkpoint", str(tmp / "learner"), what=f"saving learner checkpoint {state.version}")
        if self.critic is not None:
            await self.critic.call("save_checkpoint", str(tmp / "critic"), what=f"saving critic checkpoint {state.version}")
        published = self.run_dir.weights_version(state.version)
        if published.exists():  # hard links: no copy, and pruning the version later keeps them
            await asyncio.to_thread(link_tree, published, tmp / "weights")
        else:  # a collective weight sync wrote no folder for this version: the learner writes one
            await self.learners.call("publish", str(tmp / "weights"), serving_dtype=True, what=f"writing the weights of checkpoint {state.version}")
        if self.tokenizer is not None and not (tmp / "weights" / "tokenizer_config.json").exists():  # never write into a linked file
            await asyncio.to_thread(self._add_tokenizer, tmp / "learner" / "hf", tmp / "weights")
        write_checkpoint_state(tmp, state)
        await asyncio.to_thread(shutil.rmtree, final, True)
        os.replace(tmp, final)
        await asyncio.to_thread(prune_checkpoints, self.run_dir.root, self.keep)
        self.log.event(f"checkpoint {final.name} ({time.monotonic() - t0:.1f} s)", step=state.version)
        return final
