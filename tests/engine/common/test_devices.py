"""Where a process computes (:mod:`agentrl.engine.common.devices`): on the GPUs Ray gave it, on
none when Ray gave it none, whatever CUDA shows. Proven on a real Ray with declared GPUs that do
not exist; CUDA's availability is faked inside the actors (it is what a GPU node would report),
and the components stop at the seam's decision."""

from __future__ import annotations

from typing import Any

import pytest

from agentrl.engine.common.devices import decide_device


def test_the_decision_follows_ray_inside_an_actor_and_cuda_outside():
    assert decide_device(None, None, True).on_gpu  # a script on a GPU machine
    assert not decide_device(None, None, False).on_gpu
    zero = decide_device([], None, True)  # Ray 2.60: num_gpus = 0 leaves every GPU visible
    assert not zero.on_gpu and zero.cuda_visible and "no GPU" in zero.reason
    one = decide_device(["3"], "3", True)
    assert one.on_gpu and one.cuda_index == 0
    assert decide_device(["5", "6"], "4,5,6", True).cuda_index == 1
    assert not decide_device(["0"], "0", False).on_gpu  # declared GPUs, no CUDA: the CPU


class Probe:
    """A Ray actor on a 'GPU node': CUDA reports itself available, as it would there."""

    def __init__(self) -> None:
        import torch

        torch.cuda.is_available = lambda: True

    def choice(self) -> dict[str, Any]:
        import os

        from agentrl.engine.common.devices import resolve_device

        c = resolve_device()
        return {"on_gpu": c.on_gpu, "index": c.cuda_index, "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}

    def join(self) -> str:
        """What a critic or learner rank does first: join its (one-rank) process group and pick
        its device; returns the device."""
        import socket

        import torch.distributed as dist

        from agentrl.engine.training.devices import join_process_group

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        backend, device = join_process_group(0, 1, "127.0.0.1", port, 60.0, "critic")
        dist.destroy_process_group()
        return f"{backend} {device}"


@pytest.fixture(scope="module")
def ray_with_two_gpus():
    """A local Ray that declares 2 GPUs (there are none)."""
    import ray

    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.mark.ray
def test_an_actor_ray_gave_no_gpu_computes_on_the_cpu_though_cuda_shows_gpus(ray_with_two_gpus):
    ray = ray_with_two_gpus
    probe = ray.remote(Probe)
    gpu = probe.options(num_cpus=0, num_gpus=1).remote()
    none = probe.options(num_cpus=0, num_gpus=0).remote()
    try:
        on_gpu = ray.get(gpu.choice.remote(), timeout=120)
        zero = ray.get(none.choice.remote(), timeout=120)
        assert on_gpu["on_gpu"] and on_gpu["index"] == 0 and on_gpu["visible"] in ("0", "1")
        assert zero["visible"] is None  # Ray 2.60: on a GPU node it would see every GPU
        assert not zero["on_gpu"]
        # the critic's first step: a zero-GPU rank joins a gloo group on the CPU, not cuda:0
        assert ray.get(none.join.remote(), timeout=120) == "gloo cpu"
    finally:
        ray.kill(gpu)
        ray.kill(none)


@pytest.mark.ray
def test_the_driver_is_outside_any_actor_and_follows_cuda(ray_with_two_gpus, monkeypatch):
    import torch

    from agentrl.engine.common.devices import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device().on_gpu
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert not resolve_device().on_gpu
