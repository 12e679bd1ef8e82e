"""Ray's own '(raylet) A worker died or was killed...' paragraph goes to the run's log, not the
console, while a run routes it (agentrl.engine.common.cluster.RayErrorRoute); removed, Ray prints
as before."""

from __future__ import annotations

import os
import signal
import time

import pytest

from agentrl.engine.common.cluster import RayErrorRoute

pytestmark = pytest.mark.ray


class Sleeper:
    def pid(self) -> int:
        return os.getpid()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


def _kill_during_a_call(ray) -> None:
    actor = ray.remote(Sleeper).options(num_cpus=0).remote()
    pid = ray.get(actor.pid.remote(), timeout=60)
    ref = actor.sleep.remote(60)
    time.sleep(0.5)
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(Exception):
        ray.get(ref, timeout=60)


def _wait_for(predicate, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


def test_a_killed_workers_paragraph_goes_to_the_sink_not_the_console(capfd, monkeypatch) -> None:
    import ray
    import ray._private.ray_logging as ray_logging

    # Ray's printer deduplicates: it drops a raylet message whose text, digits and ids left out,
    # is still in its buffer (printed before in this session and not yet flushed), so two
    # "A worker died..." paragraphs a moment apart print once. Off here, so that the second half
    # sees every paragraph Ray prints once the route is removed.
    monkeypatch.setattr(ray_logging, "RAY_DEDUP_LOGS", False)

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    lines: list[str] = []
    route = RayErrorRoute(lines.append)
    try:
        _kill_during_a_call(ray)
        assert _wait_for(lambda: any("died" in line for line in lines)), lines
        out = capfd.readouterr()
        assert "(raylet)" not in out.out + out.err
        assert route.routed >= 1
        route.remove()
        _kill_during_a_call(ray)  # removed: Ray prints its paragraph again
        printed: list[str] = []

        def ray_printed() -> bool:
            printed.append(capfd.readouterr().out)
            return "(raylet)" in "".join(printed)

        assert _wait_for(ray_printed), printed
        assert route.routed == len(lines)  # nothing more reached the sink
    finally:
        route.remove()
        ray.shutdown()
