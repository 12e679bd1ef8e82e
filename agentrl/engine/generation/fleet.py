"""The generator fleet: starting the generators, keeping them healthy (a dead or broken one is
replaced by one serving the newest weights), loading weight versions into them in the
background, and their busy accounting.

How versions are *made* (broadcast, written to disk) is the publisher's job
(:mod:`agentrl.engine.loop.publishing`); the fleet asks the run's weight versions, given to it
when it is built, through :class:`WeightSource` when a replacement needs a version written.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from agentrl.engine.common.replacement import EventLog, Replacements, how_dead, tell_workers
from agentrl.engine.generation.engine_config import EngineSettings
from agentrl.engine.common.waits import timed
from agentrl.errors import GeneratorError

__all__ = ["EventLog", "GeneratorFactory", "GeneratorFleet", "Reload", "WeightSource"]

GeneratorFactory = Callable[[EngineSettings, int, int], Any]
"""``factory(settings, version, index) -> handle``: a generator (not yet started) number
``index`` serving ``settings.model`` labelled as weight version ``version``."""


class WeightSource(Protocol):
    """What the fleet needs to know of the weight versions when it replaces a generator."""

    def transfer_lost(self, reason: str) -> None:
        """A generator left the weight-transfer group: versions go through disk from now on."""

    async def written_version(self, version: int) -> tuple[int, Path | None]:
        """The newest version ``<= version`` with a folder on disk (writing the learner's
        current one when versions were broadcast): ``(version, folder)``; ``(0, None)``: none."""

    async def folder_of(self, version: int) -> Path:
        """The folder of ``version``, written now if it was only broadcast."""


@dataclass
class Reload:
    """A weight version being loaded into the generators in the background."""

    version: int
    task: asyncio.Future
    """Resolves to the generation stalls (seconds), or raises what the load raised."""


class GeneratorFleet:
    """The generators of a run and the rollout workers that use them.

    ``settings``: the engine settings new generators start from (their ``model`` is replaced by
    the newest weights folder on a replacement); ``timeout_s``: the longest wait for one call
    into a generator; ``startup_timeout_s``: for a start; ``weights``: where a replacement's
    weights come from (the run's :class:`~agentrl.engine.loop.publishing.WeightVersions`; None:
    replacements start from the initial model); ``workers``: the run's rollout workers, told
    about replacements (the run's own list, filled once they started and kept up to date by their
    failover; None: an empty one).
    """

    def __init__(
        self, *, factory: GeneratorFactory, settings: EngineSettings, count: int, log: EventLog,
        timeout_s: float, startup_timeout_s: float, weights: WeightSource | None = None, workers: list[Any] | None = None,
    ) -> None:
        self.factory = factory
        self.settings = settings
        self.count = count
        self.log = log
        self.timeout_s = timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.generators: list[Any] = []
        self.workers: list[Any] = workers if workers is not None else []
        """Rollout workers told about replacements (the run's list: filled once they exist)."""
        self.weights = weights
        """Where replacements' weights come from; None: replacements start from the initial model."""
        self.published_version = 0
        """Newest weight version the generators were given (replacements load the newest one
        written to disk)."""
        self.reload: Reload | None = None
        """The weight version being loaded from disk while the learner trains on."""
        self.adapters = settings.max_lora_rank is not None
        """Versions are LoRA adapters over ``settings.model`` (the base model), not whole models."""
        self._busy_at: dict[int, float] = {}
        self._heal_lock = asyncio.Lock()
        self.replacements = Replacements(metric="generator_restarts", log=log, error=GeneratorError,
                                         startup_timeout_s=startup_timeout_s + timeout_s + 60)  # a start, then an adapter load
        """Generators replaced so far (not bounded)."""

    # ------------------------------------------------------------------ start and stop
    async def start(self, version: int) -> list[Any]:
        """Start ``count`` generators on ``settings`` labelled ``version``; their start-up info."""
        self.generators = [self.factory(self.settings, version, i) for i in range(self.count)]
        self.published_version = version
        return list(await timed(
            asyncio.gather(*[g.start.remote() for g in self.generators]), self.startup_timeout_s, "generator start-up", GeneratorError
        ))

    def cancel_reload(self) -> None:
        """Stop waiting for a load in progress (the run ends or rewinds)."""
        if self.reload is not None and not self.reload.task.done():
            self.reload.task.cancel()
        self.reload = None

    # ------------------------------------------------------------------ health
    async def heal(self, version: int, force: tuple[Any, ...] = ()) -> int:
        """Replace every generator that does not answer a health check with a new one serving the
        current weights (version ``version`` or newer published); hand the new set to the rollout
        workers. Returns how many were replaced. Episodes that were on a dead generator are
        already marked ``infra_failure`` by the workers and stay out of the loss. ``force`` holds
        generator handles to replace even if they answer (they failed to load the weights)."""
        async with self._heal_lock:  # one repair at a time; a second caller sees the repaired set
            return await self._heal_locked(version, force)

    async def _heal_locked(self, version: int, force: tuple[Any, ...]) -> int:
        version = max(version, self.published_version)  # restart on the newest weights
        replaced = 0
        for i, gen in enumerate(list(self.generators)):
            if any(gen is f for f in force):
                reason: str | None = "it failed to load the current weights"
            else:
                reason = await how_dead(gen, "stats", timeout_s=30)
                if reason is None:
                    continue
            if self.weights is not None:
                self.weights.transfer_lost(f"generator {i} replaced")
            on_disk, folder = await self.weights.written_version(version) if self.weights is not None else (0, None)

            async def start(i: int = i, on_disk: int = on_disk, folder: Path | None = folder) -> Any:
                if self.adapters:  # the base model, then the adapter of the newest version
                    new = self.factory(self.settings, 0, i)
                    await timed(new.start.remote(), self.startup_timeout_s, f"restarting generator {i}", GeneratorError)
                    if folder is not None:
                        await timed(new.update_weights.remote(on_disk, str(folder)), self.timeout_s + 30, f"loading adapter {on_disk} into generator {i}", GeneratorError)
                    return new
                settings = replace(self.settings, model=str(folder)) if folder is not None else self.settings
                new = self.factory(settings, on_disk, i)
                await timed(new.start.remote(), self.startup_timeout_s, f"restarting generator {i}", GeneratorError)
                return new

            self.generators[i] = await self.replacements.replace(
                f"generator {i}", gen, reason, start, said=f"generator {i} restarted at version {on_disk} ({reason})"
            )
            replaced += 1
        if replaced:  # a worker that died meanwhile is its own failover's business (its replacement starts on these)
            await tell_workers(self.workers, "set_generators", self.generators)
        return replaced

    async def sleep(self, level: int) -> list[float]:
        """Colocated placement: put every generator to sleep at ``level`` (see
        :meth:`~agentrl.engine.common.interfaces.Generator.sleep`) while the learner uses the
        devices; the next load or request wakes each. Seconds each took."""
        return list(await timed(
            asyncio.gather(*[g.sleep.remote(level) for g in self.generators]), self.timeout_s + 30,
            f"putting the generators to sleep (level {level})", GeneratorError,
        ))

    # ------------------------------------------------------------------ versions from disk
    def start_load(self, version: int, folder: Path) -> None:
        """Start loading the published ``folder`` as ``version`` into every generator in the
        background (:attr:`reload`); call :meth:`finish_reload` before the next one."""
        self.published_version = version
        self.reload = Reload(version, asyncio.ensure_future(self.load(version, folder)))

    async def finish_reload(self) -> list[float]:
        """Wait for the version being loaded (if any); its generation stalls, seconds."""
        if self.reload is None:
            return []
        return list(await self.reload.task)

    async def settle_reload(self) -> list[float]:
        """Wait for the version being loaded (if any) and forget it: the next :meth:`start_load`
        (or a broadcast) takes its place. Its generation stalls, seconds."""
        stalls = await self.finish_reload()
        self.reload = None
        return stalls

    def mark_published(self, version: int) -> None:
        """The generators hold ``version``, brought there outside :meth:`start_load` (a broadcast
        over the transfer group, or a learner failover's :meth:`load`): replacements start from it."""
        self.published_version = version

    def add_workers(self, workers: list[Any]) -> None:
        """The run's rollout workers, once started: told about every generator replaced from now on."""
        self.workers.extend(workers)

    def loaded_version(self) -> int | None:
        """The version a background load finished (successfully) since the last call, or None."""
        if self.reload is None or not self.reload.task.done():
            return None
        self.reload.task.result()  # a load that failed past healing stops the run loudly
        return self.reload.version

    async def load(self, version: int, folder: Path) -> list[float]:
        """Load ``folder`` into every generator as ``version``; replace a generator that cannot
        take it. Returns the generation stalls."""
        targets = list(self.generators)
        outcomes = await timed(
            asyncio.gather(*[g.update_weights.remote(version, str(folder)) for g in targets], return_exceptions=True),
            self.timeout_s + 30,
            f"loading version {version} into the generators",
            GeneratorError,
        )
        stalls = [o for o in outcomes if not isinstance(o, BaseException)]
        broken = [i for i, o in enumerate(outcomes) if isinstance(o, BaseException)]
        if broken:  # a generator that cannot take the new weights is replaced by one that has them
            self.log.event(f"generators {broken} failed to load version {version}: {outcomes[broken[0]]!r:.200}")
            await self.heal(version, force=tuple(targets[i] for i in broken))
        await self.catch_up(targets, version)
        return stalls

    async def catch_up(self, updated: list[Any], version: int) -> None:
        """Load ``version`` into generators that a concurrent repair started (on older weights)
        while ``updated`` were taking it; one that cannot load it is replaced again."""
        async with self._heal_lock:  # waits for a repair in progress
            fresh = [g for g in self.generators if not any(g is u for u in updated)]
        if not fresh:
            return
        folder = await self.weights.folder_of(version) if self.weights is not None else None
        if folder is None:
            return
        outcomes = await timed(
            asyncio.gather(*[g.update_weights.remote(version, str(folder)) for g in fresh], return_exceptions=True),
            self.timeout_s + 30,
            f"loading version {version} into replaced generators",
            GeneratorError,
        )
        broken = tuple(g for g, o in zip(fresh, outcomes) if isinstance(o, BaseException))
        if broken:
            await self.heal(version, force=broken)

    # ------------------------------------------------------------------ accounting
    async def stats(self) -> list[dict[str, Any]]:
        """``stats()`` of every generator, or [] when one does not answer."""
        try:
            return list(await asyncio.wait_for(asyncio.gather(*[g.stats.remote() for g in self.generators]), 30))
        except Exception as exc:  # noqa: BLE001 - a dead generator: utilisation is reported without them
            self.log.event(f"generator statistics unavailable: {type(exc).__name__}: {exc}")
            return []

    async def mark_busy(self) -> None:
        """Remember each generator's busy time now (the start of what :meth:`busy_fractions` measures)."""
        self._busy_at = {id(g): st["busy_s"] for g, st in zip(self.generators, await self.stats())}

    async def busy_fractions(self, wall_s: float) -> list[float]:
        """The fraction of the last ``wall_s`` seconds (since :meth:`mark_busy`) each generator
        had a request in flight; a generator replaced meanwhile counts over its own lifetime."""
        out = []
        for g, s in zip(self.generators, await self.stats()):
            busy = s["busy_s"] - self._busy_at.get(id(g), 0.0)
            out.append(min(1.0, busy / max(1e-9, min(wall_s, s["alive_s"]))))
        return out
