"""Generator bookkeeping that needs no engine: busy time and version spans."""

import asyncio

from agentrl.engine import generator as gen_mod
from agentrl.engine.generator import EngineSettings, Generator, versions_from_spans


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_busy_time_counts_overlapping_requests_once(monkeypatch) -> None:
    clock = Clock()
    monkeypatch.setattr(gen_mod.time, "monotonic", clock)
    g = Generator(EngineSettings(model="unused"))
    a, b, c = g.busy, g.busy, g.busy
    a.__enter__()  # request A at t=100
    clock.now = 101.0
    b.__enter__()  # request B overlaps
    clock.now = 103.0
    a.__exit__(None, None, None)  # A done
    clock.now = 104.0
    b.__exit__(None, None, None)  # B done: busy 100..104
    clock.now = 110.0  # idle
    c.__enter__()
    clock.now = 111.5  # still in flight: counted up to now
    stats = asyncio.run(g.stats())
    assert stats["busy_s"] == 5.5
    assert stats["alive_s"] == 11.5
    assert g.busy.busy_s == 4.0


def test_versions_from_spans() -> None:
    assert versions_from_spans([("1", 0, 2), ("2", 2, 5)], 5, 0) == [1, 1, 2, 2, 2]
    assert versions_from_spans(None, 3, 7) == [7, 7, 7]
