"""Staleness-bounded queue between rollout and learner.

Two rules make "no sample older than ``max_staleness`` versions is ever trained" hold:

* Admission: a new sample may start only while
  ``started + n <= (min(learner_version, served_version) + max_staleness + 1) * batch_size``,
  where ``served_version`` is the version every generator serves: while a new version is still
  loading (the learner goes on training meanwhile), new samples would be written by the one
  before it, so the window waits for the load.
* Check at training time: a sample whose oldest token is more than ``max_staleness`` versions
  behind the learner is dropped (counted as ``dropped_stale``), never trained.

Groups travel together: they are admitted, queued and batched as a unit.

Refill (DAPO's dynamic sampling, ``algo.dynamic_sampling = "refill"``): the queue is given a
``classify`` function that says why a finished group carries no learning signal (its rewards are
all equal: ``"solved"`` or ``"failed"``), or None when it carries one. Such a group is *set
aside* in :meth:`StalenessQueue.put`: it never reaches a batch, and the queue records its prompt
and reason. Its admission is given back (as :meth:`~StalenessQueue.mark_lost` does) so that a
later group starts in its place and fills the batch: at most ``refill_groups`` groups per batch
(``(max_sampling_factor - 1) * batch groups``). Past that budget a set-aside group keeps its
admission and *holds a slot* of the batch in the making: the batch is ready once the groups
waiting plus the slots held make ``batch_size``, and it comes out short (the step trains what it
has). A batch whose every slot is held comes out empty; the loop then sees why from
:attr:`StalenessQueue.last_round` (every group solved: the task is mastered). Slots held beyond
what a batch needed are given back when it is taken (counted in ``QueueStats.released``). Over
a run, admission starts at most ``(version + max_staleness + 1) * batch_size`` samples plus
``refill_groups`` groups per batch taken (and one round in the making) plus the samples released
so: the over-sampling is bounded, and the staleness rules above hold for refilled groups as for
any other.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from agentrl.engine.common.trajectory import Trajectory


@dataclass
class QueueStats:
    """Counters of the queue since the start of the run (samples, not groups)."""

    started: int = 0
    finished: int = 0
    trained: int = 0
    """Samples that reached the loss with at least one trained token (:meth:`StalenessQueue.mark_trained`)."""
    taken: int = 0
    """Samples taken for training in batches (trained or not: infrastructure failures, samples
    with no generated token, groups filtered out)."""
    dropped_stale: int = 0
    dropped_infra: int = 0
    dropped_prompts: list[int] = field(default_factory=list)
    """Prompt indices of groups dropped as over-stale (never trained)."""
    set_aside: int = 0
    """Samples of groups set aside as carrying no learning signal (refill only; never trained)."""
    refilled: int = 0
    """Groups set aside whose admission was given back for a later group (refill only)."""
    released: int = 0
    """Samples of slots held by set-aside groups (past the refill budget) that their batch did
    not need, whose admission was given back when the batch was taken (refill only)."""


@dataclass
class RefillRound:
    """What the queue set aside since it last handed out a batch (refill only)."""

    set_aside: list[tuple[int, str]] = field(default_factory=list)
    """``(prompt index, reason)`` of each group set aside, in arrival order; reason ``"solved"``
    or ``"failed"`` (:func:`agentrl.engine.loop.batching.no_signal_reason`)."""
    refilled: int = 0
    """Of those, groups whose admission was given back (at most the queue's ``refill_groups``)."""
    held: int = 0
    """Samples of set-aside groups that hold a slot of the batch in the making (budget spent)."""
    short: int = 0
    """Set by :meth:`StalenessQueue.take_batch`: samples the batch came out short by (slots held)."""


class StalenessQueue:
    """Admission control and batching of finished groups, for one learner.

    ``batch_size`` is in samples; every group holds ``group_size`` samples.
    The queue holds finished groups in arrival order; its length is bounded by admission control
    (at most ``(max_staleness + 1) * batch_size`` samples exist beyond what has been trained).
    """

    def __init__(
        self, *, batch_size: int, group_size: int, max_staleness: int,
        classify: Callable[[list[Trajectory]], str | None] | None = None, refill_groups: int = 0,
    ) -> None:
        """``classify``: why a finished group carries no learning signal (``"solved"``,
        ``"failed"``) or None when it carries one; None (default): no refill, every group is
        queued. ``refill_groups``: set-aside groups per batch whose admission is given back."""
        if batch_size % group_size:
            raise ValueError(f"batch_size {batch_size} is not a multiple of group_size {group_size}")
        if refill_groups < 0:
            raise ValueError(f"refill_groups must be >= 0, got {refill_groups}")
        self.batch_size = batch_size
        self.group_size = group_size
        self.max_staleness = max_staleness
        self.classify = classify
        self.refill_groups = refill_groups
        self.round = RefillRound()
        """The set-aside account of the batch in the making."""
        self.last_round = RefillRound()
        """The account of the batch :meth:`take_batch` returned last."""
        self.learner_version = 0
        self.served_version = 0
        """The weight version every generator serves (see :meth:`serve`)."""
        self.stats = QueueStats()
        self._groups: deque[list[Trajectory]] = deque()

    # --- admission -------------------------------------------------------------------------
    def can_start(self, n: int | None = None) -> bool:
        """Whether ``n`` more samples (default: one group) may start now."""
        n = self.group_size if n is None else n
        limit = (min(self.learner_version, self.served_version) + self.max_staleness + 1) * self.batch_size
        return self.stats.started + n <= limit

    def mark_started(self, n: int | None = None) -> None:
        """Record that ``n`` samples (default: one group) started."""
        self.stats.started += self.group_size if n is None else n

    def mark_trained(self, n: int) -> None:
        """Record that ``n`` samples of a batch reached the loss with at least one trained token."""
        self.stats.trained += n

    def mark_lost(self, n: int) -> None:
        """Give back admission for ``n`` samples that started but produced nothing (re-issued)."""
        self.stats.started -= n

    # --- finished groups -------------------------------------------------------------------
    def put(self, group: list[Trajectory]) -> str | None:
        """Add a finished group; under refill, set it aside instead when it carries no learning
        signal. Returns None when it was queued, else the reason it was set aside."""
        self.stats.finished += len(group)
        reason = self.classify(group) if self.classify is not None and group else None
        if reason is None:
            self._groups.append(group)
            return None
        self.stats.set_aside += len(group)
        self.round.set_aside.append((group[0].prompt_index, reason))
        if self.round.refilled < self.refill_groups:  # a later group starts in its place
            self.round.refilled += 1
            self.stats.refilled += 1
            self.stats.started -= len(group)
        else:  # budget spent: it holds a slot of this batch, which comes out short
            self.round.held += len(group)
        return reason

    def waiting(self) -> list[list[Trajectory]]:
        """The finished groups waiting to be trained, in arrival order (a copy)."""
        return list(self._groups)

    def restore(self, groups: list[list[Trajectory]], stats: QueueStats, version: int, round: RefillRound | None = None) -> None:
        """Put the queue back as a checkpoint left it: ``groups`` waiting, counters ``stats``, the
        learner (and generators) at ``version``, ``round`` the set-aside account of the batch in
        the making (None: empty)."""
        self._groups = deque(groups)
        self.stats = stats
        self.round = round if round is not None else RefillRound()
        self.advance(version)

    def __len__(self) -> int:
        """Samples waiting."""
        return sum(len(g) for g in self._groups)

    def staleness(self, traj: Trajectory) -> int:
        """Versions between the learner now and the oldest token of ``traj`` (0 if it wrote none)."""
        oldest = traj.oldest_version
        return 0 if oldest is None else self.learner_version - oldest

    def _prune(self) -> None:
        """Drop groups holding any over-stale sample (a group is trained whole or not at all)."""
        kept: deque[list[Trajectory]] = deque()
        for group in self._groups:
            if any(self.staleness(t) > self.max_staleness for t in group):
                self.stats.dropped_stale += len(group)
                self.stats.dropped_prompts.append(group[0].prompt_index)
            else:
                kept.append(group)
        self._groups = kept

    def ready(self) -> bool:
        """Whether a full batch of fresh-enough samples is waiting (counting the slots held by
        groups set aside past the refill budget)."""
        self._prune()
        return len(self) + self.round.held >= self.batch_size

    def take_batch(self) -> list[list[Trajectory]]:
        """Remove and return ``batch_size`` samples as whole groups (call ``ready()`` first), fewer
        by the slots held by set-aside groups (refill past its budget: then :attr:`last_round`
        says by how many; the batch may be empty).

        The stalest groups are taken first (oldest token version, then arrival order): a slow
        episode that finished late is trained before it ages past the bound, instead of being
        dropped. The batch comes back in prompt order, each group in sample order, whatever order
        the groups finished in: the same groups always make the same (bit-identical) update.
        """
        self._prune()

        def age(item: tuple[int, list[Trajectory]]) -> tuple[int, int]:
            i, group = item
            oldest = [t.oldest_version for t in group if t.oldest_version is not None]
            return (min(oldest) if oldest else self.learner_version, i)

        order = [g for _, g in sorted(enumerate(self._groups), key=age)]
        held = min(self.round.held, max(0, self.batch_size - len(self)))
        self.stats.started -= self.round.held - held  # slots held that this batch did not need
        self.stats.released += self.round.held - held
        self.round.short, self.round.held = held, 0
        self.last_round, self.round = self.round, RefillRound()
        batch: list[list[Trajectory]] = []
        n = 0
        while order and n < self.batch_size - held:
            group = order.pop(0)
            batch.append(group)
            n += len(group)
        self._groups = deque(order)
        self.stats.taken += n
        return sorted(
            (sorted(g, key=lambda t: t.sample_index) for g in batch),
            key=lambda g: g[0].prompt_index if g else -1,
        )

    def advance(self, version: int, served: bool = True) -> None:
        """The learner now holds weights ``version`` (ages the queue; admits more samples once the
        generators serve it too). ``served``: the generators already serve it (the default)."""
        self.learner_version = version
        if served:
            self.serve(version)

    def serve(self, version: int) -> None:
        """Every generator now serves weights ``version`` (admits more samples)."""
        self.served_version = max(self.served_version, version)
