"""Weight publishing: how each new learner version reaches the generators.

Over a direct transfer (``generator.weight_sync = "nccl"`` or ``"gloo"``: a collective group;
``"ipc"``: CUDA IPC handles on shared GPUs) learner rank 0 sends the version into the vLLM workers;
when the group cannot be formed, or once it fails or loses a member, versions go through disk for
the rest of the run: the learner writes
``weights/vNNNNNN/`` and the fleet loads it in the background while the learner trains on. Old
version folders are pruned (``keep_versions`` are kept).
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from agentrl.engine.generation.fleet import EventLog, GeneratorFleet
from agentrl.engine.training.learner_group import LearnerGroup
from agentrl.engine.common.run_dir import RunDir
from agentrl.errors import AgentRLError, LearnerDied

__all__ = ["WeightPublisher", "WeightVersions"]


class WeightVersions:
    """The run's weight versions as the generators get them: over the transfer group or from
    disk, and the folder of a version. It is the fleet's
    :class:`~agentrl.engine.generation.fleet.WeightSource` (a replacement generator loads the
    newest written version) and the publisher's record of whether the transfer group is active;
    built before both, so neither is wired to the other after construction.

    ``learners``: the learner group that writes a version on demand; ``weight_sync``:
    ``"disk"``, ``"nccl"`` or ``"gloo"``; ``log``: where a lost transfer group is said."""

    def __init__(self, *, learners: LearnerGroup, run_dir: RunDir, log: EventLog, weight_sync: str) -> None:
        self.learners = learners
        self.run_dir = run_dir
        self.log = log
        self.weight_sync = weight_sync
        self.transfer_active = False
        """Versions go to the generators over the transfer group (else through disk)."""

    def transfer_lost(self, reason: str) -> None:
        """The transfer group lost a member (``reason``): versions go through disk from now on."""
        if self.transfer_active:
            self.transfer_active = False
            self.log.event(f"weight sync over {self.weight_sync} ended ({reason}); versions go through disk from now on", weight_sync_fallbacks=1)

    async def written_version(self, version: int) -> tuple[int, Path | None]:
        """The newest version ``<= version`` with a folder on disk: ``(version, folder)``, or
        ``(0, None)``. When versions were broadcast (none written up to ``version``), the
        learner writes its current one now."""
        on_disk, folder = self.run_dir.newest_on_disk(version)
        if on_disk < version and self.learners and self.weight_sync != "disk":
            (written, *_) = await self.learners.call(
                "publish_version", str(self.run_dir.weights), what="publishing the current version for a replaced generator"
            )
            return written, self.run_dir.weights_version(written)
        return on_disk, folder

    async def folder_of(self, version: int) -> Path:
        """The folder of ``version``; the learner writes it now when it was only broadcast."""
        folder = self.run_dir.weights_version(version)
        if not folder.exists():
            await self.learners.call("publish", str(folder), serving_dtype=True, what=f"publishing version {version}")
        return folder


class WeightPublisher:
    """Publishes learner versions to ``fleet``.

    ``weight_sync``: ``"disk"``, ``"nccl"``, ``"gloo"`` or ``"ipc"``; ``sync_timeout_s``: the bound of each
    collective and generator call of a transfer (``generator.weight_sync_timeout_s``; the wait
    for a whole broadcast is :func:`~agentrl.engine.generation.weight_transfer.send_wait_s` of
    it, longer than the learner's own watchdog); ``workers_per_generator``: transfer ranks per
    generator (its tensor parallelism); ``dtype``: the generators' parameter dtype;
    ``keep_versions``: version folders kept on disk; ``versions``: the run's
    :class:`WeightVersions`, the one the fleet was given (None: one of the publisher's own).
    """

    def __init__(
        self, *, fleet: GeneratorFleet, learners: LearnerGroup, run_dir: RunDir, log: EventLog, weight_sync: str,
        sync_timeout_s: float, workers_per_generator: int, dtype: str, keep_versions: int, versions: WeightVersions | None = None,
    ) -> None:
        self.fleet = fleet
        self.learners = learners
        self.run_dir = run_dir
        self.log = log
        self.weight_sync = weight_sync
        self.sync_timeout_s = sync_timeout_s
        self.workers_per_generator = workers_per_generator
        self.dtype = dtype
        self.keep_versions = keep_versions
        self.versions = versions if versions is not None else WeightVersions(learners=learners, run_dir=run_dir, log=log, weight_sync=weight_sync)

    @property
    def transfer_active(self) -> bool:
        """Versions go to the generators over the transfer group (else through disk)."""
        return self.versions.transfer_active

    @transfer_active.setter
    def transfer_active(self, active: bool) -> None:
        self.versions.transfer_active = active

    # ------------------------------------------------------------------ the transfer group
    async def connect(self) -> None:
        """Form the learner-to-generators transfer group when ``weight_sync`` is a collective;
        if it cannot be formed, say why and go on with disk."""
        self.transfer_active = False
        if self.weight_sync == "disk" or not self.learners:
            return
        world = 1 + len(self.fleet.generators) * self.workers_per_generator
        try:
            (address, port), *_ = await self.learners.call("weight_transfer_endpoint", what="choosing the weight-transfer endpoint", timeout=60)
            await self.learners.call(
                "connect_weight_transfer", self.weight_sync, address, port, world, self.fleet.generators, self.sync_timeout_s, self.dtype,
                what="forming the weight-transfer group", timeout=self.sync_timeout_s + 30,
            )
        except AgentRLError as exc:
            if isinstance(exc, LearnerDied):  # no fallback cures a dead rank: the run restarts the learner
                raise
            self.log.event(f"weight sync over {self.weight_sync} unavailable, versions go through disk: {exc}", weight_sync_fallbacks=1)
            return
        self.transfer_active = True
        if self.weight_sync == "ipc":
            self.log.event(f"weight sync: ipc, each learner rank's GPU memory mapped by the generator on its GPU ({world - 1} workers)")
        else:
            self.log.event(f"weight sync: {self.weight_sync} broadcast from learner rank 0 to {world - 1} generator workers at {address}:{port}")

    def transfer_lost(self, reason: str) -> None:
        """The transfer group lost a member (``reason``): versions go through disk from now on."""
        self.versions.transfer_lost(reason)

    # ------------------------------------------------------------------ publishing
    async def publish(self, version: int) -> list[float]:
        """Bring the generators to ``version``, the learner's new weights: broadcast over the
        transfer group when one is active (done when this returns), else (or when the broadcast
        fails) write the version to disk and start loading it in flight (the learner goes on
        meanwhile). First waits for the previous load. Returns the generation stalls of the
        update that completed here (the broadcast, or the previous load), seconds."""
        stalls = await self.fleet.settle_reload()
        if self.transfer_active:
            from agentrl.engine.generation.weight_transfer import send_wait_s  # torch: only with a collective

            try:
                # the learner's watchdog ends a stuck send first (aborting the group) and reports
                # it: the disk fallback below never runs its gather beside a send still blocked
                took = await self.learners.call(
                    "send_weights", version, what=f"broadcasting version {version}", timeout=send_wait_s(self.sync_timeout_s)
                )
                self.fleet.mark_published(version)
                await asyncio.to_thread(self.prune, version)  # folders written for replacements
                return [took[0]]
            except AgentRLError as exc:
                if isinstance(exc, LearnerDied):  # no fallback cures a dead rank: the run restarts the learner
                    raise
                self.transfer_active = False
                self.log.event(f"weight sync over {self.weight_sync} failed, versions go through disk from now on: {exc}", weight_sync_fallbacks=1)
        folder = self.run_dir.weights_version(version)
        await self.learners.call("publish", str(folder), serving_dtype=True, what=f"publishing version {version}")
        # the generators load it while the learner goes on with the next batch; the step after
        # waits for this load before it publishes (versions arrive in order, one load at a time)
        self.fleet.start_load(version, folder)
        await asyncio.to_thread(self.prune, version)
        return stalls

    def prune(self, newest: int) -> None:
        """Delete version folders older than the newest ``keep_versions``."""
        for v in self.run_dir.versions_on_disk():
            if v <= newest - self.keep_versions:
                shutil.rmtree(self.run_dir.weights_version(v), ignore_errors=True)
