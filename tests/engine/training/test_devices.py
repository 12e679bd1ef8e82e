"""The learner's device and process-group backend, as computed for a GPU machine (no GPU needed)."""

import torch.distributed as dist

from agentrl.engine.training.devices import local_cuda_index, process_group_backend


def test_gpu_backend_maps_cpu_tensors_to_gloo():
    assert process_group_backend(True) == "cpu:gloo,cuda:nccl"
    assert process_group_backend(False) == "gloo"
    # torch parses the device-mapped form into one backend per device type
    config = dist.BackendConfig(dist.Backend(process_group_backend(True)))
    assert config.get_device_backend_map() == {"cpu": "gloo", "cuda": "nccl"}


def test_cuda_index_follows_rays_assignment():
    assert local_cuda_index([], None) == 0  # outside Ray
    assert local_cuda_index(["3"], "3") == 0  # Ray narrowed the visible devices (its default)
    assert local_cuda_index([5, 6], "4,5,6") == 1
    assert local_cuda_index(["2"], None) == 2  # RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES: all visible
    assert local_cuda_index(["2"], "") == 2
