"""Learner placement (:mod:`agentrl.engine.training.placement`): one bundle per rank, one placement
group (``STRICT_PACK`` when one node can hold it, else ``PACK``; refused at once when the cluster
cannot), each rank in its own bundle, and the rendezvous on the node of rank 0's bundle.

The unit tests run against a fake of the few Ray calls the module makes (a two-node cluster where
rank 0's bundle is *not* on the driver's node); the ``ray`` tests start a real local Ray that
cluster of three nodes on this machine, two of them with GPUs that do not exist (Ray assigns
their ids as on a real node) and each node on its own loopback address."""

from __future__ import annotations

import importlib
import socket
import time
from typing import Any

import pytest

from agentrl.engine.common import cluster
from agentrl.engine.training import placement
from agentrl.engine.training.placement import LearnerPlacement, learner_bundles, pack_strategy
from agentrl.errors import InfraError


def test_one_bundle_per_rank_with_gpus_only_when_asked_and_custom_resources():
    assert learner_bundles(2, 4, 1, {"node:trainer": 0.01}) == [
        {"CPU": 4.0, "GPU": 1.0, "node:trainer": 0.01}, {"CPU": 4.0, "GPU": 1.0, "node:trainer": 0.01}]
    assert learner_bundles(3, 1, 0, {}) == [{"CPU": 1.0}] * 3  # no GPU key at all on CPU
    bundles = learner_bundles(2, 1, 0.5, {})
    bundles[0]["CPU"] = 99.0
    assert bundles[1]["CPU"] == 1.0  # every rank its own dict


# ------------------------------------------------------------------------------------ the fake
class FakeCluster:
    """Two nodes; the driver runs on ``node-a``. ``layout[i]`` is the node that Ray put bundle ``i``
    on. Records what was asked of Ray."""

    NODES = {"node-a": "10.0.0.1", "node-b": "10.0.0.2"}

    def __init__(self, layout: list[str], ready: bool = True, node_resources: dict[str, float] | None = None) -> None:
        self.layout, self.ready = layout, ready
        self.node_resources = node_resources or {"CPU": 64.0, "GPU": 8.0, "trainer": 8.0}  # each node's total
        self.groups: list[FakeGroup] = []
        self.removed: list[FakeGroup] = []
        self.probes: list[dict[str, Any]] = []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import ray

        pg = importlib.import_module("ray.util.placement_group")
        monkeypatch.setattr(pg, "placement_group", self.placement_group)
        monkeypatch.setattr(pg, "remove_placement_group", self.remove_placement_group)
        monkeypatch.setattr(ray, "get", self.get)
        monkeypatch.setattr(ray, "remote", self.remote)
        monkeypatch.setattr(ray, "is_initialized", lambda: True)
        monkeypatch.setattr(ray, "nodes", lambda: [
            {"NodeID": name, "Alive": True, "Resources": dict(self.node_resources)} for name in self.NODES])

    def placement_group(self, bundles: list[dict[str, float]], strategy: str) -> FakeGroup:
        group = FakeGroup(bundles, strategy)
        self.groups.append(group)
        return group

    def remove_placement_group(self, group: FakeGroup) -> None:
        self.removed.append(group)

    def remote(self, fn: Any) -> FakeRemote:
        return FakeRemote(self, fn)

    def get(self, ref: Any, timeout: float | None = None) -> Any:
        import ray

        kind, payload = ref
        if kind == "ready":
            if not self.ready:
                raise ray.exceptions.GetTimeoutError("not placed")
            return None
        # a probe task: it runs on the node its scheduling strategy puts it on (the driver's without one)
        strategy = payload.get("scheduling_strategy")
        node = "node-a"
        if strategy is not None:
            assert strategy.placement_group in self.groups
            node = self.layout[strategy.placement_group_bundle_index]
        return self.NODES[node], 29500 + list(self.NODES).index(node)


class FakeGroup:
    def __init__(self, bundles: list[dict[str, float]], strategy: str) -> None:
        self.bundles, self.strategy = bundles, strategy

    def ready(self) -> tuple[str, Any]:
        return "ready", self


class FakeRemote:
    def __init__(self, cluster: FakeCluster, fn: Any, opts: dict[str, Any] | None = None) -> None:
        self.cluster, self.fn, self.opts = cluster, fn, opts or {}

    def options(self, **opts: Any) -> FakeRemote:
        return FakeRemote(self.cluster, self.fn, {**self.opts, **opts})

    def remote(self) -> tuple[str, dict[str, Any]]:
        self.cluster.probes.append(self.opts)
        return "probe", self.opts


# ------------------------------------------------------------------------------------ unit tests
def test_the_ranks_are_reserved_together_packed_and_each_rank_is_put_in_its_own_bundle(monkeypatch):
    cluster = FakeCluster(["node-b", "node-b", "node-a"])
    cluster.install(monkeypatch)
    bundles = learner_bundles(3, 2, 1, {"trainer": 1})
    p = LearnerPlacement(bundles, timeout_s=5)
    assert len(cluster.groups) == 1 and cluster.groups[0].bundles == bundles and cluster.groups[0].strategy == "STRICT_PACK"
    assert p.strategy == "STRICT_PACK"  # one node of the cluster holds all three ranks
    for rank in range(3):
        opts = p.options(rank)
        assert (opts["num_cpus"], opts["num_gpus"], opts["resources"]) == (2.0, 1.0, {"trainer": 1.0})
        strategy = opts["scheduling_strategy"]
        assert strategy.placement_group is cluster.groups[0] and strategy.placement_group_bundle_index == rank
    assert bundles[0] == {"CPU": 2.0, "GPU": 1.0, "trainer": 1.0}  # options() did not eat the bundle
    cpu_only = LearnerPlacement(learner_bundles(1, 1, 0, {}), timeout_s=5).options(0)
    assert (cpu_only["num_gpus"], cpu_only["resources"]) == (0.0, None)


def test_the_ranks_share_one_node_whenever_one_node_could_hold_them():
    two_gpus = {"CPU": 8.0, "GPU": 2.0}
    assert pack_strategy(learner_bundles(2, 1, 1, {}), [two_gpus, two_gpus]) == "STRICT_PACK"
    # four ranks of one GPU need both nodes: as few as possible, not refused
    assert pack_strategy(learner_bundles(4, 1, 1, {}), [two_gpus, two_gpus]) == "PACK"
    # CPUs count too: two ranks of 6 CPUs cannot share an 8-CPU node
    assert pack_strategy(learner_bundles(2, 6, 0, {}), [two_gpus, two_gpus]) == "PACK"
    # a custom resource only one node has
    assert pack_strategy(learner_bundles(2, 1, 0, {"trainer": 1}), [two_gpus, {**two_gpus, "trainer": 2.0}]) == "STRICT_PACK"


def test_a_group_the_whole_cluster_cannot_hold_is_refused_at_once_in_words(monkeypatch):
    two_gpus = {"CPU": 8.0, "GPU": 2.0}
    with pytest.raises(InfraError, match=r"cannot place 5 learner rank\(s\) of \{'CPU': 1.0, 'GPU': 1.0\} each: its 2 node\(s\) hold 4"):
        pack_strategy(learner_bundles(5, 1, 1, {}), [two_gpus, two_gpus])
    with pytest.raises(InfraError, match=r"the largest node has \{'CPU': 8.0, 'GPU': 2.0, 'trainer': 0.0\}"):
        pack_strategy(learner_bundles(1, 1, 1, {"trainer": 1}), [two_gpus])
    cluster = FakeCluster(["node-a"], node_resources=two_gpus)
    cluster.install(monkeypatch)
    with pytest.raises(InfraError, match="even when idle"):
        LearnerPlacement(learner_bundles(5, 1, 1, {}), timeout_s=300)
    assert cluster.groups == []  # nothing was asked of Ray (no 300 s wait)


def test_the_rendezvous_is_on_rank_0s_node_not_the_drivers(monkeypatch):
    cluster = FakeCluster(["node-b", "node-a"])  # rank 0 on node-b; the driver is on node-a
    cluster.install(monkeypatch)
    p = LearnerPlacement(learner_bundles(2, 1, 1, {}), timeout_s=5)
    assert p.rendezvous(timeout_s=5) == ("10.0.0.2", 29501)
    (probe,) = cluster.probes
    assert probe["num_cpus"] == 0  # the probe takes nothing from rank 0's reservation
    assert probe["scheduling_strategy"].placement_group_bundle_index == 0


def test_a_reservation_that_cannot_be_placed_is_an_infra_error_and_is_released(monkeypatch):
    cluster = FakeCluster(["node-a"], ready=False)
    cluster.install(monkeypatch)
    with pytest.raises(InfraError, match=r"cannot place 2 learner rank\(s\) of \{'CPU': 1.0, 'GPU': 8.0\} each within 3 s"):
        LearnerPlacement(learner_bundles(2, 1, 8, {}), timeout_s=3)
    assert cluster.removed == cluster.groups  # the half-made reservation is not left holding resources


def test_release_is_idempotent(monkeypatch):
    cluster = FakeCluster(["node-a"])
    cluster.install(monkeypatch)
    p = LearnerPlacement(learner_bundles(1, 1, 0, {}), timeout_s=5)
    p.release()
    p.release()
    assert cluster.removed == cluster.groups and p.group is None


# ------------------------------------------------------------------------------------ real Ray
@pytest.fixture(scope="module")
def three_node_ray():
    """A real Ray cluster on this machine: a head without GPUs (the driver's node) and two nodes of
    2 GPUs each that do not exist, each on its own loopback address (127.0.0.2 and 127.0.0.3), so
    that "rank 0's node" and "the driver's node" have different addresses as on a real cluster."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        for ip in ("127.0.0.2", "127.0.0.3"):
            cluster.add_node(num_cpus=1, num_gpus=2, node_ip_address=ip)
        ray.init(address=cluster.address, log_to_driver=False)
        cluster.wait_for_nodes()
        yield ray
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.mark.ray
def test_on_a_real_ray_each_rank_gets_its_own_gpu_and_rank_0s_node_is_the_rendezvous(three_node_ray):
    ray = three_node_ray
    from ray.util.placement_group import placement_group_table

    @ray.remote
    class Rank:
        def where(self) -> tuple[str, str, str]:
            import os

            ctx = ray.get_runtime_context()
            return ctx.get_node_id(), ctx.get_placement_group_id(), os.environ.get("CUDA_VISIBLE_DEVICES", "")

    ips = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
    driver_ip = ips[ray.get_runtime_context().get_node_id()]
    p = LearnerPlacement(learner_bundles(2, 0.5, 1, {}), timeout_s=60)
    group = p.group
    try:
        ranks = [Rank.options(**p.options(r)).remote() for r in range(2)]
        seen = ray.get([r.where.remote() for r in ranks], timeout=60)
        layout = placement_group_table(group)["bundles_to_node_id"]
        assert [node for node, _, _ in seen] == [layout[0], layout[1]]  # rank r runs in bundle r
        assert {pg for _, pg, _ in seen} == {group.id.hex()}
        gpus = [(node, g) for node, _, g in seen]
        assert all(g for _, g in gpus) and len(set(gpus)) == 2  # a (fake) GPU each, never the same one
        address, port = p.rendezvous(timeout_s=60)
        assert address == ips[layout[0]] != driver_ip  # rank 0's node (the head has no GPU), not the driver's
        with socket.socket() as s:
            s.bind((address, port))  # and the port is free there
        for r in ranks:
            ray.kill(r)
    finally:
        p.release()
        p.release()  # idempotent
    assert placement_group_table(group)["state"] == "REMOVED"


@pytest.mark.ray
def test_on_a_real_ray_more_gpus_than_the_cluster_has_is_an_infra_error_and_frees_the_rest(three_node_ray):
    ray = three_node_ray
    from ray.util.placement_group import placement_group_table

    before = {g for g, t in placement_group_table().items() if t["state"] != "REMOVED"}
    with pytest.raises(InfraError, match="cannot place 3 learner rank.*even when idle"):
        LearnerPlacement(learner_bundles(3, 0.1, 2, {}), timeout_s=300)  # 6 GPUs of 4: refused at once
    after = {g for g, t in placement_group_table().items() if t["state"] != "REMOVED"}
    assert after == before
    # every GPU free again (an earlier test's killed actors give theirs back asynchronously)
    deadline = time.monotonic() + 30
    while ray.available_resources().get("GPU") != 4.0 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("GPU") == 4.0


def test_current_node_id_is_none_outside_ray(monkeypatch):
    import ray

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    assert cluster.current_node_id() is None


@pytest.mark.ray
def test_on_a_real_ray_colocated_rank_and_generator_i_share_gpu_i_and_outlive_a_learner_restart(three_node_ray):
    ray = three_node_ray
    from ray.util.placement_group import placement_group_table

    from agentrl.engine.training.placement import SharedPlacement

    @ray.remote
    class Actor:
        def where(self) -> tuple[str, str]:
            import os

            return ray.get_runtime_context().get_node_id(), os.environ.get("CUDA_VISIBLE_DEVICES", "")

    p = SharedPlacement(2, 0.5, {}, timeout_s=60).with_learner_cpus(0.25)
    group = p.group
    try:
        assert p.options(0)["num_gpus"] == SharedPlacement.SHARE and p.options(0)["num_cpus"] == 0.25
        ranks = [Actor.options(**p.options(i)).remote() for i in range(2)]
        gens = [Actor.options(**p.generator_options(i, 0.25)).remote() for i in range(2)]
        rank_at = ray.get([a.where.remote() for a in ranks], timeout=60)
        gen_at = ray.get([a.where.remote() for a in gens], timeout=60)
        assert rank_at == gen_at  # pair i: the same node and the same (fake) GPU
        assert all(g for _, g in rank_at) and len(set(rank_at)) == 2  # and the two pairs never share one
        p.release()  # what a learner restart does: the generators stay in the bundles
        assert placement_group_table(group)["state"] == "CREATED"
        for a in [*ranks, *gens]:
            ray.kill(a)
    finally:
        p.close()
    assert placement_group_table(group)["state"] == "REMOVED"


@pytest.mark.ray
def test_on_a_real_ray_a_group_reserved_first_is_strictly_packed_and_generators_take_the_rest(three_node_ray):
    """Two ranks of one GPU on two nodes of two GPUs: reserved before two one-GPU generators (as the
    controller does), both ranks land on one node and both generators on the other; the ranks
    never straddle the nodes as a soft ``PACK`` after the generators allows."""
    ray = three_node_ray
    from ray.util.placement_group import placement_group_table

    @ray.remote
    class Actor:
        def node(self) -> str:
            return ray.get_runtime_context().get_node_id()

    p = LearnerPlacement(learner_bundles(2, 0.25, 1, {}), timeout_s=60)
    group = p.group
    try:
        assert p.strategy == "STRICT_PACK"
        gens = [Actor.options(num_cpus=0.25, num_gpus=1).remote() for _ in range(2)]
        ranks = [Actor.options(**p.options(r)).remote() for r in range(2)]
        rank_nodes = ray.get([a.node.remote() for a in ranks], timeout=60)
        gen_nodes = ray.get([a.node.remote() for a in gens], timeout=60)
        assert len(set(rank_nodes)) == 1 and set(placement_group_table(group)["bundles_to_node_id"].values()) == set(rank_nodes)
        assert set(gen_nodes).isdisjoint(rank_nodes) and len(set(gen_nodes)) == 1
        for a in [*ranks, *gens]:
            ray.kill(a)
    finally:
        p.release()

