"""The rollout worker: the Ray actor that plays groups of episodes for the RL loop and evaluation.

It joins three parts, each in its own module: the :class:`~agentrl.engine.episodes.routing.GeneratorRouter`
(which generator a group goes to, bounded generator calls), the
:class:`~agentrl.engine.episodes.runner.EpisodeRunner` (one environment or agent episode, the
sandbox and the agent gateway) and the :class:`~agentrl.engine.rewards.scoring_bundle.ScoringBundle`
(the model-based rewards). The worker itself runs a group's episodes concurrently (an anyio task
group, at most ``max_concurrent_episodes`` at once), scores them and writes the audit log.
A single episode without a worker is :func:`~agentrl.engine.episodes.env_episode.play_episode`.
"""

from __future__ import annotations

from typing import Any

import anyio

from agentrl.engine.common.audit import AuditLog
from agentrl.engine.common.trajectory import Trajectory
from agentrl.engine.episodes.routing import GeneratorRouter
from agentrl.engine.episodes.runner import EpisodeRunner, EpisodeSettings
from agentrl.engine.rewards.scoring_bundle import ScoringBundle, ScoringSettings

__all__ = ["RolloutWorker"]


class RolloutWorker:
    """Plays groups of episodes concurrently against one environment type (or one agent program).

    Its keyword arguments are what :func:`agentrl.engine.wiring.worker_kwargs` gives, the
    generators and the reward actors' handles; the worker hands each to the part it belongs to:
    ``generators`` and ``generate_timeout_s`` to the router, ``episodes`` to the runner,
    ``scoring``, ``judge_generators`` and ``reward_model`` to the scoring bundle.
    """

    def __init__(
        self,
        *,
        episodes: EpisodeSettings,
        scoring: ScoringSettings | None = None,
        generators: list[Any],
        generate_timeout_s: float,
        max_concurrent_episodes: int,
        audit_path: str | None = None,
        judge_generators: list[Any] | None = None,
        reward_model: Any = None,
    ) -> None:
        """``episodes``: what the episodes are (environment or agent, sandbox, sampling, budgets,
        seed, the policy's tokenizer; see :class:`~agentrl.engine.episodes.runner.EpisodeSettings`).
        ``scoring``: the model-based rewards
        (:class:`~agentrl.engine.rewards.scoring_bundle.ScoringSettings`; None: the environment's
        reward alone). ``generators``: the policy's generator handles, each call bounded by
        ``generate_timeout_s`` seconds. ``max_concurrent_episodes``: episodes of this worker
        running at once at most. ``audit_path``: append one record per finished episode to this
        append-only file (see :mod:`agentrl.engine.common.audit`); None writes none.
        ``judge_generators``: a separate judge model's generator handles (None: the judge asks the
        policy's own generators); ``reward_model``: a
        :class:`~agentrl.engine.rewards.reward_model.RewardModelServer` handle (None: none)."""
        self.router = GeneratorRouter(generators, generate_timeout_s=generate_timeout_s)
        self.runner = EpisodeRunner.from_settings(episodes)
        self.scoring = ScoringBundle.from_settings(
            scoring if scoring is not None else ScoringSettings(), tokenizer=self.runner.tokenizer,
            judge_generators=judge_generators, reward_model=reward_model,
        )
        self.limiter = anyio.CapacityLimiter(max_concurrent_episodes)
        self.audit = AuditLog(audit_path) if audit_path else None

    @property
    def outstanding(self) -> list[int]:
        """Tokens (prompt + max new) of this worker's requests in flight, per generator."""
        return self.router.outstanding

    def ping(self) -> bool:
        """True once the worker is constructed (the controller's start-up check)."""
        return True

    def process_id(self) -> int:
        """This worker's process id (the controller's start-up check; what a replacement tears
        down after the process died: e.g. the Docker sandbox containers it labelled)."""
        import os

        return os.getpid()

    def sandbox_stats(self) -> dict[str, int]:
        """This worker's process id (``pid``) and its sandbox's counters since it started (a
        bubblewrap sandbox's :class:`~agentrl.sandbox.bubblewrap.PoolStats`, e.g.
        ``workers_replaced``, after it forgot the idle warm workers that died); only the pid for a
        sandbox that keeps none, or no sandbox."""
        import dataclasses
        import os

        reap = getattr(self.runner.sandbox, "reap_dead_workers", None)
        if reap is not None:  # a worker killed while idle is counted now, not at its next execution
            reap()
        stats = getattr(self.runner.sandbox, "stats", None)
        counters = dataclasses.asdict(stats) if dataclasses.is_dataclass(stats) and not isinstance(stats, type) else {}
        return {"pid": os.getpid(), **{k: int(v) for k, v in counters.items()}}

    def set_generators(self, generators: list[Any]) -> None:
        """Replace the generator handles (after a restart); groups in flight keep theirs."""
        self.router.set_generators(generators)

    def set_judge_generators(self, generators: list[Any]) -> None:
        """Replace a separate judge's generator handles (after one was replaced); groups being
        scored keep the judge they were given."""
        self.scoring.set_judge_generators(generators)

    def set_reward_model(self, reward_model: Any) -> None:
        """Replace the reward model's handle (after it was replaced); scores in flight keep theirs."""
        self.scoring.set_reward_model(reward_model)

    async def run_group(
        self, row: dict[str, Any], prompt_index: int, group_id: str, n: int, sampling: dict[str, Any] | None = None,
        score: bool = True,
    ) -> list[Trajectory]:
        """Play ``n`` episodes of the prompt ``row`` concurrently; return them in sample order.
        ``sampling`` overrides the worker's sampling arguments for this group (e.g. greedy eval);
        ``score``: add the model-based rewards (judge, reward model) to each finished episode
        (evaluation passes False: it reports the environment's reward alone)."""
        results: list[Trajectory | None] = [None] * n
        gen_index = self.router.pick()
        generate = self.router.generate_fn(gen_index)
        scorer = self.scoring.scorer(generate) if score else None
        keep_messages = scorer is not None and scorer.wants_messages

        async def one(i: int) -> None:
            async with self.limiter:
                results[i] = t = await self.runner.play(
                    generate, row=row, group_id=group_id, prompt_index=prompt_index, sample_index=i, sampling=sampling,
                    keep_messages=keep_messages,
                )
                if scorer is not None:
                    await scorer.score(t, row)
                if self.audit is not None:
                    self._audit(t)

        # the group's expected load is reserved at once, so that groups starting together spread out
        with self.router.reserved(gen_index, n * self.runner.max_new_tokens):
            await self.runner.ready()
            async with anyio.create_task_group() as tg:
                for i in range(n):
                    tg.start_soon(one, i)
        return [r for r in results if r is not None]

    def _audit(self, t: Trajectory) -> None:
        made = [v for v in t.versions if v >= 0]
        self.audit.append({  # type: ignore[union-attr]
            "id": t.sample_id,
            "prompt": t.prompt_index,
            "status": t.status,
            "reward": t.reward,
            "generated": t.num_generated,
            "versions": [min(made), max(made)] if made else None,
        })

    async def shutdown(self) -> None:
        """Close the gateway and the sandbox."""
        await self.runner.shutdown()
