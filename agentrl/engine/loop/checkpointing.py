"""Writing a resumable run checkpoint: the learner's state (every rank), the critic's (PPO with
GAE), the weights of the checkpoint's version and the run state, into ``checkpoints/step_NNNNNN/`` atomically.

The folder's format (and reading it back) is :mod:`agentrl.engine.loop.run_state`'s.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from dataclasses import dataclass
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


_POLL_S = 0.1
"""How often a checkpoint being written in the background is looked for on disk (seconds)."""


@dataclass
class _Pending:
    """A run checkpoint whose learner (and critic) state is being written in the background:
    its hidden folder, where it goes, its version, the seconds its save held the loop, when the
    save returned (``time.monotonic()``), the task that puts it in place once the ranks wrote
    it, and whether that has begun."""

    tmp: Path
    final: Path
    version: int
    held_s: float
    saved_at: float
    watcher: asyncio.Task[None] | None = None
    placing: bool = False


class RunCheckpointer:
    """Writes checkpoints of a run; keeps the newest ``keep``.

    ``tokenizer``: the folder or hub id the run's tokenizer is read from (saved into each
    checkpoint's weights, so a checkpoint is self-contained; None saves none). ``critic``: PPO's
    critic group, saved into ``critic/`` (None: no critic). ``background``: the learner (and
    critic) ranks write their state in a thread while training goes on (see
    :meth:`agentrl.engine.training.fsdp_rank.FsdpRank.save_state`); the checkpoint is put in
    ``checkpoints/`` as soon as their folders are there (a task that looks every ``_POLL_S``),
    at the latest at :meth:`finish`, which the loop calls after the next learner step and
    :meth:`save` calls first. False: :meth:`save` returns with the checkpoint in place."""

    def __init__(
        self, *, run_dir: RunDir, learners: LearnerGroup, keep: int, tokenizer: str | None, log: EventLog,
        critic: LearnerGroup | None = None, background: bool = False,
    ) -> None:
        self.run_dir = run_dir
        self.learners = learners
        self.critic = critic
        self.keep = keep
        self.tokenizer = tokenizer
        self.log = log
        self.background = background
        self._pending: _Pending | None = None

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

    @property
    def pending(self) -> int | None:
        """The version of the checkpoint being written in the background, or None."""
        return self._pending.version if self._pending is not None else None

    async def save(self, state: RunState) -> Path:
        """Write ``checkpoints/step_N`` for ``state`` (N = ``state.version``); its folder (in
        place on return unless :attr:`background`: then once the ranks wrote it)."""
        await self.finish()
        root = self.run_dir.checkpoints
        final = self.run_dir.checkpoint(state.version)
        tmp = root / f".{final.name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        t0 = time.monotonic()
        bg = self.background
        await self.learners.call("save_checkpoint", str(tmp / "learner"), background=bg, what=f"saving learner checkpoint {state.version}")
        if self.critic is not None:
            await self.critic.call("save_checkpoint", str(tmp / "critic"), background=bg, what=f"saving critic checkpoint {state.version}")
        published = self.run_dir.weights_version(state.version)
        if published.exists():  # hard links: no copy, and pruning the version later keeps them
            await asyncio.to_thread(link_tree, published, tmp / "weights")
        else:  # a collective weight sync wrote no folder for this version: the learner writes one
            await self.learners.call("publish", str(tmp / "weights"), serving_dtype=True, what=f"writing the weights of checkpoint {state.version}")
        write_checkpoint_state(tmp, state)
        now = time.monotonic()
        pending = self._pending = _Pending(tmp, final, state.version, now - t0, now)
        if bg:
            pending.watcher = asyncio.ensure_future(self._place_when_written(pending))
        else:
            await self._place(pending)
        return final

    def _written(self, pending: _Pending) -> bool:
        """Whether the ranks' folders of ``pending`` are in place (each appears whole, by a rename)."""
        parts = [pending.tmp / "learner"] + ([pending.tmp / "critic"] if self.critic is not None else [])
        return all((p / "trainer_state.json").is_file() for p in parts)

    async def _place_when_written(self, pending: _Pending) -> None:
        """Put ``pending`` in place as soon as the ranks' folders are (the watcher's task)."""
        while not self._written(pending):
            await asyncio.sleep(_POLL_S)
        await self._place(pending)

    async def _place(self, pending: _Pending) -> None:
        """Put the run checkpoint ``pending`` in place (the tokenizer beside its weights, the
        rename over an earlier folder of the same step), prune the old ones and say so; once."""
        if pending.placing:
            return
        pending.placing = True
        weights = pending.tmp / "weights"
        if self.tokenizer is not None and not (weights / "tokenizer_config.json").exists():  # never write into a linked file
            await asyncio.to_thread(self._add_tokenizer, pending.tmp / "learner" / "hf", weights)
        await asyncio.to_thread(shutil.rmtree, pending.final, True)
        os.replace(pending.tmp, pending.final)
        if self._pending is pending:
            self._pending = None
        await asyncio.to_thread(prune_checkpoints, self.run_dir.root, self.keep)
        how = f"; written in the background in {time.monotonic() - pending.saved_at:.1f} s" if pending.watcher is not None else ""
        self.log.event(f"checkpoint {pending.final.name} ({pending.held_s:.1f} s{how})", step=pending.version)

    async def finish(self) -> Path | None:
        """Wait until the checkpoint being written in the background, if any, is in place: the
        ranks end their writes (a failed one raises, a dead rank LearnerDied; the checkpoint is
        then dropped) and it is put in place; its folder, or None when none was pending."""
        pending = self._pending
        if pending is None:
            return None
        try:
            for group, name in ((self.learners, "learner"), (self.critic, "critic")):
                if group is not None:
                    await group.call("finish_checkpoint", what=f"writing the {name} state of checkpoint {pending.version}")
            if pending.watcher is not None:
                await asyncio.wait_for(asyncio.shield(pending.watcher), timeout=60)
        except BaseException:
            self.drop()
            raise
        return pending.final

    def drop(self) -> None:
        """Forget the checkpoint being written in the background (its ranks died or were
        restarted): its watcher stops and its hidden folder is removed; the newest checkpoint in
        place stays the newest."""
        pending, self._pending = self._pending, None
        if pending is not None:
            if pending.watcher is not None and not pending.watcher.done():
                pending.watcher.cancel()
            shutil.rmtree(pending.tmp, ignore_errors=True)
