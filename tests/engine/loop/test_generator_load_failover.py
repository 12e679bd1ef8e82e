"""A generator killed while it loads a new weight version (issue 37): the fleet sees the load
fail, replaces the generator with one serving that version (from its folder on disk), and the run
goes on to ``max_steps`` with every prompt trained once. Over the shipped fakes
(agentrl.engine.testing): the generator's actor dies in the middle of ``update_weights``, as a
SIGKILL during vLLM's reload would end it (the caller never gets an answer; later calls find it
dead). The real process killed as a version is published: ``benchmarks/chaos.py``'s
``generator-load`` fault."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Callable
from typing import Any

from agentrl.engine.testing import FakeGenerator, FakeRun, LocalActor, local_actor

ROWS = [{"reward": float(i % 2)} for i in range(200)]
DIE_AT = 3
"""The weight version whose load the first generator dies in."""


class DiesLoading(FakeGenerator):
    """A fake generator whose process dies part-way through loading version ``die_at``;
    ``also``: called as it dies (to kill another actor at the same moment)."""

    def __init__(self, version: int, die_at: int) -> None:
        super().__init__(version, delay_s=0.005)
        self.die_at = die_at
        self.handle: LocalActor | None = None

    async def update_weights(self, version: int, path: str) -> float:
        if version == self.die_at and self.handle is not None:
            self.handle.kill()  # the process is gone mid-load: the call never answers
            await asyncio.sleep(0.01)
        return await super().update_weights(version, path)


class KillsOnStart(FakeGenerator):
    """A replacement generator whose start-up is the moment ``kill`` is called (another actor
    dying while the fleet repairs itself)."""

    def __init__(self, version: int, kill: Callable[[], None]) -> None:
        super().__init__(version, delay_s=0.005)
        self.kill = kill

    async def start(self) -> dict[str, Any]:
        self.kill()
        return await super().start()


def events(run: FakeRun) -> list[dict]:
    return [r for r in map(json.loads, run.run_dir.metrics.read_text().splitlines()) if r["kind"] == "event"]


def run_with_a_death_during_a_load(tmp_path: Any, *, with_worker: bool = False) -> tuple[FakeRun, Any, list[tuple[int, LocalActor]]]:
    """A 6-step run whose first generator dies while loading version ``DIE_AT`` (``with_worker``:
    rollout worker 0 dies while the generator's replacement starts); the loop, and every
    generator made as ``(version it started at, handle)``."""
    run = FakeRun(tmp_path, rows=ROWS, max_steps=6, batch_size=4, group_size=2, worker_restarts=2 if with_worker else None)
    made: list[tuple[int, LocalActor]] = []

    def factory(settings: Any, version: int, index: int) -> LocalActor:
        gen: FakeGenerator
        if not made:
            gen = DiesLoading(version, DIE_AT)
        elif with_worker and len(made) == 1:
            gen = KillsOnStart(version, lambda: run.fleet.workers[0].kill())
        else:
            gen = FakeGenerator(version, delay_s=0.005)
        handle = local_actor(gen, f"generator {index}")
        if isinstance(gen, DiesLoading):
            gen.handle = handle
        made.append((version, handle))
        return handle

    run.fleet.factory = factory
    loop = asyncio.run(run.run())
    return run, loop, made


def test_a_generator_killed_during_a_weight_load_is_replaced_with_that_version(tmp_path):
    run, loop, made = run_with_a_death_during_a_load(tmp_path)
    assert loop.version == 6
    said = [e["message"] for e in events(run)]
    assert any(m.startswith(f"generators [0] failed to load version {DIE_AT}") for m in said), said
    restarts = [e for e in events(run) if e.get("generator_restarts")]
    assert len(restarts) == 1, said
    # replaced with the version it was loading (its folder on disk), not the one it had
    assert f"restarted at version {DIE_AT}" in restarts[0]["message"], restarts
    assert len(made) == 2 and made[1][0] == DIE_AT
    dead, new = made[0][1], made[1][1]
    assert dead.dead and not new.dead and run.fleet.generators[0] is new
    # the replacement (which also had the version in flight loaded again) took every later one, in order
    assert [v for v, _ in new.obj.loaded if v > DIE_AT] == list(range(DIE_AT + 1, 7)) and new.obj.version == 6
    # each prompt trained once, no sample twice
    prompts = [p for line in map(json.loads, run.run_dir.trained.read_text().splitlines()) for p in line["prompts"]]
    assert len(prompts) == len(set(prompts)), Counter(prompts).most_common(3)
    ids = [i for _, step_ids in run.trained for i in step_ids]
    assert len(ids) == len(set(ids))
    assert loop.ledger.abandoned == []


def test_a_generator_and_the_rollout_worker_killed_together_during_a_load(tmp_path):
    """Found by benchmarks/chaos.py (a generator and the rollout worker SIGKILLed at once): the
    replaced generator is handed to the dead worker too; that failure is the rollout failover's
    business, not the end of the run (it was: Ray's ActorDiedError, raw, out of the load)."""
    run, loop, made = run_with_a_death_during_a_load(tmp_path, with_worker=True)
    assert loop.version == 6
    said = [e["message"] for e in events(run)]
    assert len([e for e in events(run) if e.get("generator_restarts")]) == 1, said
    assert len([e for e in events(run) if e.get("rollout_worker_restarts")]) == 1, said
    assert run.workers_made == 2 and run.fleet.generators[0] is made[-1][1]
    # the new worker generates on the new generator
    assert run.fleet.workers[0].obj.generators[0] is made[-1][1]
    ids = [i for _, step_ids in run.trained for i in step_ids]
    assert len(ids) == len(set(ids))
