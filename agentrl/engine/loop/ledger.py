"""The prompt ledger: which dataset prompts were issued, are in flight, wait for a retry, were
abandoned — the account behind "every prompt is trained exactly once".

Prompt ``i`` is dataset row ``i % num_rows``. A prompt is issued as one *group* (``group_size``
episodes). Its group either finishes with at least one trainable episode (it goes to the
staleness queue), or is lost to the infrastructure: then the prompt is re-issued as a new group
(id ``p<i>-<attempt>``), at most ``max_attempts`` times in this process, and abandoned after.
Under refill the queue may set a finished group aside as carrying no learning signal: the
ledger records it (:meth:`PromptLedger.record_set_aside`) as *sampled, no signal* — neither lost
(not re-issued in this pass over the data) nor trained.

The ledger and the :class:`~agentrl.engine.loop.staleness.StalenessQueue` together are the whole run
state; :meth:`PromptLedger.snapshot` turns them into the one :class:`RunState` that checkpoints
store and :meth:`PromptLedger.summary` into what ``summary.json`` says.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Hashable
from dataclasses import replace
from enum import Enum
from pathlib import Path
from typing import Any

from agentrl.engine.loop.run_state import RunState
from agentrl.engine.loop.staleness import RefillRound, StalenessQueue
from agentrl.engine.common.summary import RunSummary
from agentrl.engine.common.trajectory import AGENT_FAILURE, Trajectory
from agentrl.errors import InfraError, one_line

__all__ = ["MAX_PROMPT_ATTEMPTS", "Outcome", "PromptLedger"]

MAX_PROMPT_ATTEMPTS = 3
"""Times a prompt whose whole group failed on infrastructure is tried before it is abandoned."""


class Outcome(Enum):
    """What became of a finished group."""

    QUEUED = "queued"
    """At least one episode is trainable: the group waits in the staleness queue."""
    RETRY = "retry"
    """Lost to the infrastructure: the prompt is issued again."""
    ABANDONED = "abandoned"
    """Lost ``max_attempts`` times: given up."""


class PromptLedger:
    """Issues prompts and accounts for every group until it is queued or abandoned.

    ``num_rows``: dataset rows (0: nothing new to issue, only retries); ``group_size``: episodes
    per group; ``max_attempts``: tries per prompt lost to the infrastructure;
    ``max_lost_in_a_row``: groups lost one after the other before the run stops (the rollout is
    broken, not unlucky).
    """

    def __init__(self, *, num_rows: int, group_size: int, max_attempts: int = MAX_PROMPT_ATTEMPTS, max_lost_in_a_row: int = 8) -> None:
        self.num_rows = num_rows
        self.group_size = group_size
        self.max_attempts = max_attempts
        self.max_lost_in_a_row = max_lost_in_a_row
        self.cursor = 0
        """Next fresh prompt index."""
        self.retry: deque[int] = deque()
        """Prompts to issue before fresh ones (re-issued after a loss or on resume)."""
        self.in_flight: dict[Hashable, tuple[int, str]] = {}
        """Groups running now, by the caller's key: ``(prompt index, group id)``."""
        self.attempts: Counter[int] = Counter()
        """Losses per prompt in this process."""
        self.abandoned: list[int] = []
        self.infra_failures = 0
        """Samples lost to the infrastructure so far."""
        self.agent_failures = 0
        """Samples lost because the agent program failed (raised, timed out) so far."""
        self.gen_tokens = 0
        """Generated tokens so far (trainable or not)."""
        self.lost_in_a_row = 0
        """Groups lost one after the other, up to now."""
        self.last_error = ""
        """What the newest lost group failed on."""
        self.set_aside: list[tuple[int, str]] = []
        """``(prompt index, reason)`` of every group the queue set aside (refill), in order."""

    # ------------------------------------------------------------------ issuing
    def has_next(self) -> bool:
        """Whether a prompt can be issued (a retry waits, or the dataset is not empty)."""
        return bool(self.retry) or self.num_rows > 0

    def issue(self, key: Hashable) -> tuple[int, str]:
        """Issue the next prompt (a retry first) under ``key``; returns ``(index, group_id)``."""
        idx = self.retry.popleft() if self.retry else self.cursor
        if idx == self.cursor:
            self.cursor += 1
        gid = f"p{idx}-{self.attempts[idx]}" if self.attempts[idx] else f"p{idx}"  # a retry is a new group
        self.in_flight[key] = (idx, gid)
        return idx, gid

    def row_index(self, idx: int) -> int:
        """The dataset row of prompt ``idx``."""
        return idx % self.num_rows

    # ------------------------------------------------------------------ outcomes
    def finish(self, key: Hashable, group: list[Trajectory], error: str = "", actor_replaced: bool = False) -> Outcome:
        """Account for the group issued under ``key``: ``group`` holds its episodes ([] when the
        call failed, with ``error`` saying why; for a group of failed episodes ``error``, when
        given, says why in place of the first episode's error). Raises InfraError when groups keep
        being lost. ``actor_replaced``: the group was lost with an actor that was replaced (its
        rollout worker, :mod:`agentrl.engine.loop.rollout_failover`; the judge generator or reward
        model scoring it): re-issued as usual, but not counted towards ``max_lost_in_a_row`` (one
        process died; the rollout is not broken)."""
        idx, gid = self.in_flight.pop(key)
        failed = [t for t in group if not t.trainable]
        agent_failed = sum(t.status == AGENT_FAILURE for t in failed)
        self.agent_failures += agent_failed
        self.infra_failures += len(failed) - agent_failed if group else self.group_size
        self.gen_tokens += sum(t.num_generated for t in group)
        if group and len(failed) < len(group):
            self.lost_in_a_row = 0
            return Outcome.QUEUED
        if group and not error:
            error = failed[0].info.get("error", "") or failed[0].status
        what = "in the agent program" if group and agent_failed == len(group) else "on infrastructure"
        self.last_error = f"group {gid} failed {what} ({one_line(error)})"
        self.lost_in_a_row += 0 if actor_replaced else 1
        if self.lost_in_a_row > self.max_lost_in_a_row:
            raise InfraError(f"rollout keeps failing ({self.lost_in_a_row} groups lost in a row); last: {one_line(error, 300)}")
        self.attempts[idx] += 1
        if self.attempts[idx] < self.max_attempts:
            self.retry.append(idx)
            return Outcome.RETRY
        self.abandoned.append(idx)
        return Outcome.ABANDONED

    def record_set_aside(self, idx: int, reason: str) -> None:
        """Prompt ``idx``'s group was sampled but set aside as carrying no learning signal
        (``reason``: ``"solved"`` or ``"failed"``): not trained, not lost, not re-issued."""
        self.set_aside.append((idx, reason))

    def set_aside_by_reason(self) -> dict[str, list[int]]:
        """The set-aside prompt indices by reason, each list in order."""
        out: dict[str, list[int]] = {}
        for idx, reason in self.set_aside:
            out.setdefault(reason, []).append(idx)
        return out

    def cancel_all(self) -> list[int]:
        """Forget every group in flight (their results will never be read); their prompts."""
        prompts = [idx for idx, _ in self.in_flight.values()]
        self.in_flight.clear()
        return prompts

    # ------------------------------------------------------------------ state
    def snapshot(self, version: int, queue: StalenessQueue, evals: list[dict[str, Any]]) -> RunState:
        """The run state right after learner step ``version``: groups in flight are re-issued on
        a resume (their admission is given back), finished groups wait in the queue."""
        return RunState(
            version=version,
            cursor=self.cursor,
            reissue=list(self.retry) + [idx for idx, _ in self.in_flight.values()],
            queued=queue.waiting(),
            stats=replace(queue.stats, started=queue.stats.started - self.group_size * len(self.in_flight),
                          dropped_prompts=list(queue.stats.dropped_prompts)),
            infra_failures=self.infra_failures,
            agent_failures=self.agent_failures,
            gen_tokens=self.gen_tokens,
            evals=list(evals),
            abandoned=list(self.abandoned),
            set_aside=list(self.set_aside),
            refill_round=replace(queue.round, set_aside=list(queue.round.set_aside)),
        )

    @classmethod
    def restore(cls, state: RunState, queue: StalenessQueue, **kwargs: Any) -> PromptLedger:
        """A ledger (and ``queue``) as they were at ``state``; ``kwargs`` as for the constructor."""
        ledger = cls(**kwargs)
        ledger.cursor = state.cursor
        ledger.retry.extend(state.reissue)
        ledger.infra_failures, ledger.gen_tokens = state.infra_failures, state.gen_tokens
        ledger.agent_failures = state.agent_failures
        ledger.abandoned = list(state.abandoned)
        ledger.set_aside = list(getattr(state, "set_aside", []))  # (a checkpoint written before refill has none)
        held = getattr(state, "refill_round", None)
        queue.restore(state.queued, replace(state.stats, dropped_prompts=list(state.stats.dropped_prompts)), state.version,
                      replace(held, set_aside=list(held.set_aside)) if held is not None else RefillRound())
        return ledger

    def untrained(self, queue: StalenessQueue) -> list[int]:
        """Issued prompts not trained (yet): in flight, waiting for a retry or queued (set-aside
        prompts are not among them: see :attr:`set_aside`)."""
        return sorted([idx for idx, _ in self.in_flight.values()] + list(self.retry) + [g[0].prompt_index for g in queue.waiting() if g])

    def summary(self, run_dir: Path, version: int, final: Path, queue: StalenessQueue) -> RunSummary:
        """The run's outcome after ``version`` learner steps, its final model at ``final``."""
        return RunSummary(
            run_dir=run_dir,
            steps=version,
            version=version,
            final_checkpoint=final,
            samples_trained=queue.stats.trained,
            dropped_stale=queue.stats.dropped_stale,
            infra_failures=self.infra_failures,
            agent_failures=self.agent_failures,
            prompt_cursor=self.cursor,
            untrained_prompts=self.untrained(queue),
            dropped_prompts=list(queue.stats.dropped_prompts),
            abandoned_prompts=list(self.abandoned),
            set_aside_prompts=self.set_aside_by_reason(),
        )
