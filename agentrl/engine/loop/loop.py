"""The RL loop: admit → route → wait → train, until ``max_steps`` learner steps.

One round: take a weight version the generators finished loading into account; issue prompts
while the staleness window admits them (each group goes to the next rollout worker); start a
learner step when a batch is ready and the learner is free; wait for whatever finishes first (a
group, the step, a load). A finished group is queued, or its prompt re-issued or abandoned by
the :class:`~agentrl.engine.loop.ledger.PromptLedger`; a finished step is logged, checkpointed and
evaluated on schedule.

Under refill (``algo.dynamic_sampling = "refill"``) the queue sets aside groups without a learning
signal (:mod:`agentrl.engine.loop.staleness`); the loop records them in the ledger, in
``audit/set_aside.jsonl`` and in the step's line of ``trained.jsonl``. A batch that comes out
empty because every group sampled for it within the budget was *solved* ends the run early, as
a success (:attr:`RLLoop.ended_early`); an empty batch for any other reason is a step that holds
the weights (``hold_step``) and is diagnosed as degenerate. Without refill, a run stopped by
``learner.max_degenerate_steps`` whose degenerate steps were all *solved* (every group at the
solved reward) ends early as a success too; any other run of degenerate steps is a
:class:`~agentrl.errors.DegenerateRun`.

Everything the loop touches is injected: the queue, the ledger, the fleet, the publisher, the
learner group, a clock and *hooks* — objects whose ``on_round(loop)`` and ``after_step(loop)``
run at those points (fault injection in tests, see :mod:`agentrl.engine.testing`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from agentrl.engine.common.audit import AuditLog, set_aside_audit_path
from agentrl.engine.common.replacement import ActorSlots
from agentrl.engine.loop.batching import FAILED, SOLVED, BatchSettings, batch_samples, no_signal_reason, staleness_histogram
from agentrl.engine.loop.critic_stage import CriticStage
from agentrl.engine.loop.degenerate import diagnose_step
from agentrl.engine.generation.fleet import GeneratorFleet
from agentrl.engine.training.learner_group import LearnerGroup
from agentrl.engine.loop.ledger import Outcome, PromptLedger
from agentrl.engine.loop.publishing import WeightPublisher
from agentrl.engine.loop.rollout_failover import RolloutFailover
from agentrl.engine.common.run_dir import RunDir
from agentrl.engine.loop.run_state import RunState
from agentrl.engine.loop.staleness import RefillRound, StalenessQueue
from agentrl.engine.common.trajectory import Trajectory
from agentrl.engine.common.waits import timed
from agentrl.errors import AgentRLError, DegenerateRun, TimeoutError_

__all__ = ["LoopHook", "LoopSettings", "RLLoop"]


@dataclass(frozen=True)
class LoopSettings:
    """The loop's numbers (from the recipe, by :mod:`agentrl.engine.wiring`)."""

    max_steps: int
    """Learner steps to reach (the loop ends at this version)."""
    group_size: int
    """Episodes per prompt."""
    episode_timeout_s: float
    """Longest wait for one group of episodes."""
    stuck_timeout_s: float
    """Longest wait for *anything* to finish in one round (a last guard: every wait has its own)."""
    checkpoint_every: int = 0
    """Checkpoint after every this many steps (0: not by step count)."""
    checkpoint_every_s: float = 0.0
    """Checkpoint after the first step that ends this many seconds after the previous checkpoint
    (or the loop's start); 0: not by time."""
    checkpoint_first_step: bool = False
    """Checkpoint after step 1 (a learner that dies early restarts from it)."""
    checkpoint_at_eval: bool = False
    """Checkpoint at every mid-run evaluation (``eval_every``)."""
    eval_every: int = 0
    """Evaluate after every this many steps (0: never)."""
    max_degenerate_steps: int = 0
    """Stop the run after this many degenerate steps in a row (:mod:`agentrl.engine.loop.degenerate`; 0: never)."""
    max_episode_tokens: int | None = None
    """The episode token limit, named in the words of a degenerate step."""
    colocated: bool = False
    """Generators and learner take turns on the same devices (:mod:`agentrl.placement_plan`): a
    step starts only when no group is in flight, and no group starts while it trains, so each
    side has the devices to itself."""
    sleep_level: int = 0
    """Colocated: the generators sleep at this level while the learner trains (GPUs: 1 keeps the
    weights in host memory, for LoRA's base; 2 drops them, a new version replaces them; CPUs: 1,
    the engines' processes are stopped); 0: they do not sleep (separate)."""
    offload_learner: bool = False
    """Colocated on GPUs (``learner.offload_states``): after each published step the learner
    ranks move their parameters and optimizer states to host memory while the generators work;
    the next step brings them back."""


class LoopHook(Protocol):
    """Code run at fixed points of the loop (fault injection, instrumentation)."""

    async def on_round(self, loop: RLLoop) -> None:
        """After admission, before waiting, every round."""

    async def after_step(self, loop: RLLoop) -> None:
        """After a learner step was logged (and checkpointed, evaluated on schedule)."""


class Evaluation(Protocol):
    """Evaluates the generators' current weights (``agentrl.engine.loop.evaluation.Evaluator``)."""

    records: list[dict[str, Any]]

    async def __call__(self, version: int) -> dict[str, Any]: ...


class RLLoop:
    """Turns the loop from ``version`` to ``settings.max_steps``: ``await RLLoop(...).run()``.

    ``rows``: the dataset; ``log``: a MetricsLogger; ``checkpoint``: writes a checkpoint of a
    :class:`RunState` (None: never); ``finish_checkpoint``: puts a checkpoint written in the
    background in place (called after the learner step that follows it, and when the loop
    ends; None: checkpoints are in place when ``checkpoint`` returns); ``evaluate``: an evaluation (None: never); ``clock``: seconds,
    monotonic (for throughput and utilisation); ``critic``: PPO's critic (per-token GAE
    advantages, trained beside the policy; None: the batch estimator ``batch.advantage``)."""

    def __init__(
        self, *, rows: Sequence[dict[str, Any]], queue: StalenessQueue, ledger: PromptLedger, fleet: GeneratorFleet,
        publisher: WeightPublisher, learners: LearnerGroup, batch: BatchSettings, settings: LoopSettings, log: Any,
        run_dir: RunDir, checkpoint: Callable[[RunState], Awaitable[Any]] | None = None,
        finish_checkpoint: Callable[[], Awaitable[Any]] | None = None, evaluate: Evaluation | None = None,
        version: int = 0, clock: Callable[[], float] = time.monotonic, hooks: Sequence[LoopHook] = (),
        critic: CriticStage | None = None, rollout_failover: RolloutFailover | None = None,
        reward_actors: Mapping[str, ActorSlots] | None = None,
    ) -> None:
        self.rows = rows
        self.rollout_failover = rollout_failover
        """Replaces a rollout worker that died (None: a dead worker's groups are only lost)."""
        self._worker_of: dict[int, Any] = {}
        """The rollout worker of each group in flight, by ledger key."""
        self.reward_actors: Mapping[str, ActorSlots] = dict(reward_actors or {})
        """The replaceable reward actors (a separate judge's generators, the reward model) by the
        scorer name an episode's ``info["reward_failure"]`` gives them; checked (and a dead one
        replaced) when an episode's scoring by them failed."""
        self._reward_restarts_at: dict[int, dict[str, int]] = {}
        """Each reward actor kind's replacements so far when each group in flight was issued, by ledger key."""
        self.queue = queue
        self.ledger = ledger
        self.fleet = fleet
        self.publisher = publisher
        self.learners = learners
        self.critic = critic
        self.batch = batch
        self.settings = settings
        self.log = log
        self.run_dir = run_dir
        self.checkpoint = checkpoint
        self.finish_checkpoint = finish_checkpoint
        self.evaluate = evaluate
        self.version = version
        """The learner's weight version (= learner steps done)."""
        self.clock = clock
        self.hooks = list(hooks)
        self.pending: dict[asyncio.Future, int] = {}
        """Groups in flight: future → ledger key."""
        self.learner_busy_s = 0.0
        """Seconds the learner spent training and publishing."""
        self.degenerate_in_a_row = 0
        """Degenerate steps (:mod:`agentrl.engine.loop.degenerate`) in a row, up to now."""
        self.solved_in_a_row = 0
        """Of those, the steps in a row whose every group was solved (all episodes at the solved reward)."""
        self._tickets = itertools.count()
        self._worker_turn = itertools.count()
        self._train_task: asyncio.Future | None = None
        self._training_prompts: list[int] = []
        self._training_round = RefillRound()
        """The set-aside account of the batch in training (refill)."""
        self.ended_early = ""
        """Why the loop ended before ``max_steps`` (the task is mastered), in words; "" if it did not."""
        self._set_aside_audit: AuditLog | None = None
        self._t_start = 0.0
        self._last_checkpoint_t = 0.0
        """When the previous checkpoint was written (the loop's clock; the loop's start before the first)."""
        self._gen_tokens_at_start = 0

    # ------------------------------------------------------------------ the loop
    async def run(self) -> int:
        """Run to ``max_steps``; the final version. Groups still in flight are cancelled when it
        returns or raises; a background load is waited for on success."""
        s = self.settings
        await self.fleet.mark_busy()
        self._t_start = self.clock()
        self._last_checkpoint_t = self._t_start
        self._gen_tokens_at_start = self.ledger.gen_tokens
        self.log.event(f"RL loop started at version {self.version}", loop_start=True, step=self.version)
        try:
            while self.version < s.max_steps and not self.ended_early:
                loaded = self.fleet.loaded_version()
                if loaded is not None and self.queue.served_version < loaded:
                    self.queue.serve(loaded)  # the generators serve it: admit more samples
                self._admit()
                for hook in self.hooks:
                    await hook.on_round(self)
                if self._train_task is None and self.queue.ready() and not (s.colocated and self.pending):
                    batch = self.queue.take_batch()  # in prompt order: reproducible updates
                    if not batch and self._mastered(self.queue.last_round):
                        break
                    self._training_prompts = [g[0].prompt_index for g in batch if g]
                    self._training_round = self.queue.last_round
                    self._train_task = asyncio.ensure_future(self._train(batch, self.version))
                await self._wait_round()
        finally:
            self._abandon_in_flight()
        if self.finish_checkpoint is not None:
            await self.finish_checkpoint()
        await self.fleet.finish_reload()  # the final evaluation runs on the final weights
        await self._log_utilisation()
        return self.version

    def _admit(self) -> None:
        """Issue prompts while the staleness window admits a group (colocated: not while the
        learner trains, it has the devices)."""
        if self.settings.colocated and self._train_task is not None:
            return
        workers = self.fleet.workers
        while self.queue.can_start() and self.ledger.has_next():
            key = next(self._tickets)
            idx, gid = self.ledger.issue(key)
            row = self.rows[self.ledger.row_index(idx)]
            worker = workers[next(self._worker_turn) % len(workers)]
            self._worker_of[key] = worker
            if self.reward_actors:
                self._reward_restarts_at[key] = {name: a.restarts for name, a in self.reward_actors.items()}
            fut = asyncio.ensure_future(
                timed(worker.run_group.remote(row, idx, gid, self.settings.group_size), self.settings.episode_timeout_s, f"group {gid}")
            )
            self.pending[fut] = key
            self.queue.mark_started()

    async def _wait_round(self) -> None:
        reload = self.fleet.reload
        loading = reload.task if reload is not None and not reload.task.done() else None
        waiting = set(self.pending) | ({self._train_task} if self._train_task else set()) | ({loading} if loading else set())
        if not waiting:
            raise AgentRLError("nothing to wait for: no prompts left and no batch ready")
        limit = self.settings.stuck_timeout_s
        done, _ = await asyncio.wait(waiting, timeout=limit, return_when=asyncio.FIRST_COMPLETED)
        if not done:
            raise TimeoutError_(f"no episode group and no learner step finished within {limit:.0f} s")
        for fut in done:
            if fut is loading:  # served at the top of the next round
                continue
            if fut is self._train_task:
                self._train_task = None
                await self._step_done(fut.result())  # a learner/generator failure stops the run loudly
            else:
                await self._group_done(fut)

    def _abandon_in_flight(self) -> None:
        for fut in [*self.pending, *([self._train_task] if self._train_task else [])]:
            if not fut.done():
                fut.cancel()
        self._train_task = None

    # ------------------------------------------------------------------ groups
    async def _group_done(self, fut: asyncio.Future) -> None:
        key = self.pending.pop(fut)
        worker = self._worker_of.pop(key, None)
        reward_restarts_at = self._reward_restarts_at.pop(key, {})
        error = ""
        worker_died = False
        try:
            group: list[Trajectory] = fut.result()
        except Exception as exc:  # noqa: BLE001 - a worker died or timed out: the group is lost
            group, error = [], f"{type(exc).__name__}: {exc}"
            if self.rollout_failover is not None and worker is not None:  # a dead worker is replaced
                worker_died = await self.rollout_failover.group_lost(worker, exc)
                if worker_died:  # said once, by the replacement's event; one short line per group here
                    error = "its rollout worker died"
        failed = [t for t in group if not t.trainable]
        if not group or any("GeneratorError" in t.info.get("error", "") for t in failed):
            await self.fleet.heal(self.version)
        replaced = await self._reward_actors_lost(failed, reward_restarts_at)
        if replaced and not worker_died:  # said once, by the replacement's event; one short line per group here
            error, worker_died = f"its {replaced} died", True
        if failed:  # the first failure of the group, with its error (an agent's traceback), for reading
            t = failed[0]
            with self.run_dir.samples.open("a") as f:
                f.write(json.dumps({"version": self.version, "group_id": t.group_id, "sample": t.sample_index,
                                    "reward": t.reward, "status": t.status, "error": t.info.get("error", ""),
                                    "text": t.info.get("text", ""), "spans": t.info.get("spans", [])}) + "\n")
        outcome = self.ledger.finish(key, group, error, actor_replaced=worker_died)
        if outcome is Outcome.QUEUED:
            reason = self.queue.put(group)
            if reason is not None:  # refill: sampled, no learning signal
                self._record_set_aside(group, reason)
            return
        # nothing of it can be trained: the prompt goes round again rather than filling a batch
        # slot with an empty group, a bounded number of times
        self.queue.mark_lost(self.settings.group_size)
        what = "re-issued" if outcome is Outcome.RETRY else "abandoned"
        self.log.event(f"{self.ledger.last_error}; {what}")

    async def _reward_actors_lost(self, failed: list[Trajectory], restarts_at: dict[str, int]) -> str:
        """Check the reward actors whose scoring failed an episode of ``failed`` (a dead one is
        replaced now); the kind in words of one replaced since the group was issued (its
        episodes' failures are that death's), or "" when none was."""
        names = {n.strip() for t in failed for n in t.info.get("reward_failure", "").split(",")} & self.reward_actors.keys()
        for name in sorted(names):
            await self.reward_actors[name].check()  # past its bound: an error in words stops the run
        return next((self.reward_actors[n].name for n in sorted(names) if self.reward_actors[n].restarts > restarts_at.get(n, 0)), "")

    # ------------------------------------------------------------------ steps
    async def _train(self, batch: list[list[Trajectory]], version: int) -> dict[str, Any]:
        """Train on ``batch`` with the learner at ``version``; publish ``version + 1`` (over disk
        the generators are still loading it when this returns)."""
        hist = staleness_histogram(batch, version)
        samples, stats = batch_samples(batch, self.batch)
        stats["solved_groups"] = sum(no_signal_reason(g, self.batch) == SOLVED for g in batch if g)
        if self.settings.sleep_level:  # colocated: the learner gets the GPUs' memory, or the CPUs' cores
            slept = await self.fleet.sleep(self.settings.sleep_level)
            stats["generator_sleep_s"] = max(slept) if slept else 0.0
        t0 = self.clock()
        what = f"learner step {version + 1}"
        if not batch:  # refill found no group with a learning signal within its budget
            results = await self.learners.call("hold_step", what=what)
        elif self.critic is None:
            results = await self.learners.call("train_step", samples, what=what)
        else:
            samples, gae_stats = await self.critic.advantages(samples, version)
            policy = (self.learners.call("hold_step", what=what) if self.critic.policy_frozen(version)
                      else self.learners.call("train_step", samples, what=what))
            results, critic_stats = await asyncio.gather(policy, self.critic.train(samples, version))
            stats.update(gae_stats, **critic_stats)
        train_s = self.clock() - t0
        new_version = version + 1
        stalls = await self.publisher.publish(new_version)
        if self.settings.offload_learner:  # the generators get the devices' memory back
            offloaded = await self.learners.call("offload_states", what=f"offloading the learner after step {new_version}")
            stats["learner_offload_s"] = max(offloaded)
        learner_busy_s = self.clock() - t0  # training + publishing (+ offloading)
        m = results[0]
        examples = [
            {"group_id": t.group_id, "sample": t.sample_index, "reward": t.reward, "status": t.status, "text": t.info.get("text", ""),
             "spans": t.info.get("spans", []), "turns": t.metrics.get("turns", 0), **({"error": t.info["error"]} if t.info.get("error") else {})}
            for t in [g[0] for g in batch[:2] if g]  # the first episode of two groups: the ones decoded for reading
        ] if batch else []
        return {
            "_examples": examples,
            **stats,
            **{k: v for k, v in m.items() if k != "step"},
            "staleness_hist": hist,
            "train_tokens_per_s": m["trained_tokens"] / max(1e-9, train_s),
            # the batch's way to the ranks and the metrics' way back: the call's time beyond the rank's own
            **({"step_transfer_s": max(0.0, train_s - m["train_s"])} if self.critic is None and "train_s" in m else {}),
            "publish_s": learner_busy_s - train_s,
            "update_stall_s": max(stalls) if stalls else 0.0,
            "learner_busy_s": learner_busy_s,
            "version": new_version,
        }

    async def _step_done(self, stats: dict[str, Any]) -> None:
        s = self.settings
        if self.finish_checkpoint is not None:  # the previous checkpoint was written while this step trained
            await self.finish_checkpoint()
        self.version = version = stats["version"]
        self.learner_busy_s += stats["learner_busy_s"]
        examples = stats.pop("_examples", [])
        self.queue.mark_trained(stats["samples_trained"])
        stats.update(self._sampling_metrics(stats))
        problem = diagnose_step(stats, max_episode_tokens=s.max_episode_tokens)
        self.degenerate_in_a_row = self.degenerate_in_a_row + 1 if problem else 0
        all_solved = bool(problem) and 0 < stats.get("groups", 0) == stats.get("solved_groups", 0)
        self.solved_in_a_row = self.solved_in_a_row + 1 if all_solved else 0
        if problem:
            self.log.warning(f"step {version} is degenerate: {problem}", degenerate=problem, step=version)
        with self.run_dir.samples.open("a") as f:  # a few decoded episodes, for reading
            for ex in examples:
                f.write(json.dumps({"version": version, **ex}) + "\n")
        self.queue.advance(version, served=self.fleet.reload is None)
        with self.run_dir.trained.open("a") as f:
            aside = {"set_aside": [list(x) for x in self._training_round.set_aside]} if self._training_round.set_aside else {}
            f.write(json.dumps({"step": version, "prompts": self._training_prompts, **aside}) + "\n")
        if self._training_round.short and stats["groups"]:
            self.log.event(
                f"step {version}: the sampling budget ran out (algo.max_sampling_factor; {len(self._training_round.set_aside)} groups "
                f"set aside without a learning signal): trained {len(self._training_prompts)} of {self._batch_groups} groups",
                step=version,
            )
        ledger = self.ledger
        self.log.step(
            step=version,
            **stats,
            gen_tokens_per_s=(ledger.gen_tokens - self._gen_tokens_at_start) / max(1e-9, self.clock() - self._t_start),
            queue_depth=len(self.queue),
            started=self.queue.stats.started,
            dropped_stale=self.queue.stats.dropped_stale,
            infra_failures=ledger.infra_failures,
            agent_failures=ledger.agent_failures,
            prompt_cursor=ledger.cursor,
            degenerate=1.0 if problem else 0.0,
        )
        if problem and s.max_degenerate_steps and self.degenerate_in_a_row >= s.max_degenerate_steps:
            if self.solved_in_a_row >= self.degenerate_in_a_row:  # every group of those steps solved
                self.ended_early = (
                    f"the model solves every training prompt sampled for the last {self.solved_in_a_row} steps (every episode "
                    f"earned at least {self.batch.solved_reward:g}, so no group had a learning signal; "
                    f"learner.max_degenerate_steps={s.max_degenerate_steps}): the task is mastered, the run ends at step "
                    f"{version} of {s.max_steps}"
                )
                self.log.event(self.ended_early, mastered=True, step=version)
                return
            raise DegenerateRun(
                f"stopped after {self.degenerate_in_a_row} degenerate steps in a row (learner.max_degenerate_steps="
                f"{s.max_degenerate_steps}, 0 never stops): {problem}"
            )
        if self.checkpoint is not None and version < s.max_steps and self._checkpoint_due(version):
            await self.checkpoint(self.snapshot())
            self._last_checkpoint_t = self.clock()
        if self.evaluate is not None and s.eval_every and version % s.eval_every == 0 and version < s.max_steps:
            await self.fleet.finish_reload()  # evaluate the new version, not the one before
            self.queue.serve(version)
            await self.evaluate(version)
        for hook in self.hooks:
            await hook.after_step(self)

    def _checkpoint_due(self, version: int) -> bool:
        """Whether step ``version`` is checkpointed: by step count, after step 1, at a mid-run
        evaluation, or when ``checkpoint_every_s`` passed since the previous checkpoint."""
        s = self.settings
        return bool(
            (s.checkpoint_every and version % s.checkpoint_every == 0)
            or (s.checkpoint_first_step and version == 1)
            or (s.checkpoint_at_eval and s.eval_every and self.evaluate is not None and version % s.eval_every == 0)
            or (s.checkpoint_every_s and self.clock() - self._last_checkpoint_t >= s.checkpoint_every_s)
        )

    # ------------------------------------------------------------------ dynamic sampling
    @property
    def _batch_groups(self) -> int:
        return self.queue.batch_size // self.queue.group_size

    def _record_set_aside(self, group: list[Trajectory], reason: str) -> None:
        """Account for a group the queue set aside: the ledger, and the append-only audit log."""
        idx = group[0].prompt_index
        self.ledger.record_set_aside(idx, reason)
        if self._set_aside_audit is None:
            self._set_aside_audit = AuditLog(set_aside_audit_path(self.run_dir.root))
        trainable = [t for t in group if t.trainable]
        self._set_aside_audit.append({"prompt": idx, "group": group[0].group_id, "reason": reason,
                                      "reward": trainable[0].reward if trainable else None, "version": self.version})

    def _mastered(self, round: RefillRound) -> bool:
        """Whether an empty batch with account ``round`` means the task is mastered: every group
        sampled for it was set aside as solved. Then says so and sets :attr:`ended_early`."""
        n = len(round.set_aside)
        if not n or any(reason != SOLVED for _, reason in round.set_aside):
            return False
        self.ended_early = (
            f"the model solves {n} of {n} training prompts sampled for step {self.version + 1} (every episode earned at "
            f"least {self.batch.solved_reward:g}; the sampling budget, algo.max_sampling_factor, found no group with a "
            f"learning signal): the task is mastered, the run ends at step {self.version} of {self.settings.max_steps}"
        )
        self.log.event(self.ended_early, mastered=True, step=self.version)
        return True

    def _sampling_metrics(self, stats: dict[str, Any]) -> dict[str, Any]:
        """The step's dynamic-sampling numbers: groups sampled for it (batched or set aside),
        groups with a learning signal, the refill factor (sampled / the batch's groups), groups
        set aside whose admission went to a later group, groups set aside as solved and as failed."""
        aside = self._training_round.set_aside
        sampled = stats["groups"] + len(aside)
        return {
            "groups_sampled": sampled,
            "groups_with_signal": stats["groups"] - stats["zero_variance_groups"],
            "refill_factor": sampled / max(1, self._batch_groups),
            "groups_refilled": self._training_round.refilled,
            "set_aside_solved": sum(1 for _, r in aside if r == SOLVED),
            "set_aside_failed": sum(1 for _, r in aside if r == FAILED),
        }

    def snapshot(self) -> RunState:
        """The run state now (between steps): what a checkpoint stores."""
        records = self.evaluate.records if self.evaluate is not None else []
        return self.ledger.snapshot(self.version, self.queue, records)

    async def _log_utilisation(self) -> None:
        """Log the ``utilisation`` record of the loop: the fraction of its wall-clock each
        generator had a request in flight and the learner was training or publishing."""
        wall_s = self.clock() - self._t_start
        gen = await self.fleet.busy_fractions(wall_s)
        self.log.log(
            "utilisation",
            rl_wall_s=wall_s,
            learner_busy_fraction=min(1.0, self.learner_busy_s / max(1e-9, wall_s)),
            generator_busy_fraction=sum(gen) / len(gen) if gen else float("nan"),
            generator_busy_fractions=gen,
        )
