"""The NCCL failure path's timeouts agree: the controller waits for a broadcast longer than the
learner's own watchdog on it (plus the abort's grace), so a stuck send is always ended by the
learner (the transfer group aborted, the failure reported) before the controller falls back to
disk and starts the gather of the weights beside it. Both bounds come from one setting
(``generator.weight_sync_timeout_s``); no transfer group is formed (the connection is replaced
at its seam, ``trainer_connect``)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from agentrl.engine.common.run_dir import RunDir
from agentrl.engine.generation import weight_transfer as wt
from agentrl.engine.loop.publishing import WeightPublisher
from agentrl.engine.training.weight_export import WeightSender


class Learners:
    """The learner group as the publisher sees it: records each call's wait."""

    def __init__(self) -> None:
        self.waits: dict[str, float | None] = {}

    def __bool__(self) -> bool:
        return True

    async def call(self, method: str, *args: Any, what: str, timeout: float | None = None, **kwargs: Any) -> list[Any]:
        self.waits[method] = timeout
        return [0.5]


class Fleet:
    """The fleet as the publisher sees it: nothing loading."""

    def __init__(self) -> None:
        self.reload: Any = None
        self.published_version = 0
        self.weights: Any = None
        self.generators: list[Any] = []

    async def finish_reload(self) -> list[float]:
        return []

    async def settle_reload(self) -> list[float]:
        return []

    def mark_published(self, version: int) -> None:
        self.published_version = version


class Log:
    def event(self, text: str, **counters: Any) -> None:
        raise AssertionError(f"unexpected event: {text}")


@pytest.mark.parametrize("sync_timeout_s", [300.0, 20.0])
def test_the_controller_waits_for_a_send_longer_than_the_learners_watchdog(monkeypatch, tmp_path, sync_timeout_s):
    monkeypatch.setattr(wt, "trainer_connect", lambda backend, **kw: object())
    monkeypatch.setattr(wt, "model_source", lambda lm, dtype: None)
    sender = WeightSender(0, torch.device("cpu"))
    sender.connect("nccl", "127.0.0.1", 29500, 2, [], sync_timeout_s, torch.nn.Linear(2, 2), "bfloat16")
    watchdog = sender._timeout_s  # the learner aborts the group past this
    assert watchdog >= sync_timeout_s  # a whole send spans several collectives

    learners = Learners()
    publisher = WeightPublisher(
        fleet=Fleet(), learners=learners, run_dir=RunDir(tmp_path), log=Log(), weight_sync="nccl",
        sync_timeout_s=sync_timeout_s, workers_per_generator=1, dtype="bfloat16", keep_versions=3,
    )
    publisher.transfer_active = True
    assert asyncio.run(publisher.publish(1)) == [0.5]
    wait = learners.waits["send_weights"]
    assert wait is not None and wait > watchdog + wt.ABORT_GRACE_S, (
        f"the controller gives up on a send after {wait} s, the learner's watchdog aborts it after {watchdog} s "
        f"(+{wt.ABORT_GRACE_S} s grace): the disk fallback would gather beside a stuck broadcast"
    )
