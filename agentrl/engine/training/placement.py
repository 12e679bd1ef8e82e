"""Where the learner ranks run: one Ray placement group, and a rendezvous on rank 0's node.

The ranks of a learner group must meet at one TCP address (``torch.distributed``'s rendezvous).
Picking ``127.0.0.1`` and a port on the driver works only while every rank shares the driver's
machine. Here the ranks are reserved together as a placement group (one bundle per rank), and
the rendezvous is rank 0's own node address with a port free there, found by a task that runs in
rank 0's bundle.

The group is ``STRICT_PACK`` (every rank on one node) whenever one node of the cluster could hold
all of it, and ``PACK`` (as few nodes as possible) only when none could: a soft ``PACK`` lets Ray
spread a group that fits on one node over several when that node is busy, and the ranks' every
collective then crosses the network. A group that the whole cluster could not hold even empty is
refused at once, in words, instead of waiting out the placement timeout. The controller reserves
the learner's (and critic's) group before it creates the generators (:meth:`LearnerGroup.reserve
<agentrl.engine.training.learner_group.LearnerGroup.reserve>`), so that they cannot take the node
first.
"""

from __future__ import annotations

from typing import Any

from agentrl.errors import InfraError

__all__ = ["LearnerPlacement", "SharedPlacement", "learner_bundles", "pack_strategy"]


def learner_bundles(num_ranks: int, num_cpus: float, num_gpus: float, resources: dict[str, float]) -> list[dict[str, float]]:
    """One Ray resource bundle per rank: ``CPU`` (and ``GPU`` when ``num_gpus`` > 0) plus the
    custom ``resources`` each rank needs."""
    bundle = {"CPU": float(num_cpus), **({"GPU": float(num_gpus)} if num_gpus else {}), **{k: float(v) for k, v in resources.items()}}
    return [dict(bundle) for _ in range(num_ranks)]


def _fits(bundle: dict[str, float], node: dict[str, float]) -> int:
    """How many copies of ``bundle`` the resources ``node`` hold (a resource a node lacks is 0)."""
    counts = [int(node.get(k, 0.0) // v + 1e-9) for k, v in bundle.items() if v > 0]
    return min(counts) if counts else 1 << 30


def pack_strategy(bundles: list[dict[str, float]], nodes: list[dict[str, float]]) -> str:
    """``"STRICT_PACK"`` when one of ``nodes`` (each node's *total* resources) can hold all of
    ``bundles`` (identical, as :func:`learner_bundles` makes them), else ``"PACK"`` when the nodes
    together can; raises :class:`InfraError` when even the whole cluster, empty, cannot, naming
    what one rank needs and what the largest node has. No ``nodes`` known: ``"PACK"``."""
    if not bundles or not nodes:
        return "PACK"
    bundle, n = bundles[0], len(bundles)
    per_node = [_fits(bundle, node) for node in nodes]
    if max(per_node) >= n:
        return "STRICT_PACK"
    if sum(per_node) >= n:
        return "PACK"
    largest = max(nodes, key=lambda node: _fits(bundle, node))
    has = {k: largest.get(k, 0.0) for k in bundle}
    raise InfraError(
        f"the cluster cannot place {n} learner rank(s) of {bundle} each: its {len(nodes)} node(s) hold "
        f"{sum(per_node)} such rank(s) even when idle (the largest node has {has}); "
        "lower learner.num_ranks/num_cpus/num_gpus or add nodes"
    )


def _node_resources() -> list[dict[str, float]]:
    """The total resources of every alive node of the connected Ray cluster."""
    import ray

    return [dict(n.get("Resources", {})) for n in ray.nodes() if n.get("Alive")]


def _endpoint() -> tuple[str, int]:
    from agentrl.engine.generation.weight_transfer import free_endpoint

    return free_endpoint()


class LearnerPlacement:
    """A reserved placement group for ``len(bundles)`` learner ranks (Ray must be initialised),
    on one node whenever one node could hold them (:func:`pack_strategy`; ``strategy`` says which).

    ``rendezvous()`` gives rank 0's ``(address, port)``; ``options(rank)`` the Ray actor options
    that put rank ``rank`` in its bundle; ``release()`` frees the reservation (idempotent).
    """

    def __init__(self, bundles: list[dict[str, float]], timeout_s: float) -> None:
        import ray
        from ray.util.placement_group import placement_group

        self.bundles = bundles
        self.strategy = pack_strategy(bundles, _node_resources())
        self.group = placement_group(bundles, strategy=self.strategy)
        try:
            ray.get(self.group.ready(), timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            self.release()
            raise InfraError(
                f"the cluster cannot place {len(bundles)} learner rank(s) of {bundles[0]} each within {timeout_s:.0f} s "
                "(see `ray status` for free resources; lower learner.num_ranks/num_cpus/num_gpus or add nodes)"
            ) from None

    def options(self, rank: int) -> dict[str, Any]:
        """``num_cpus``/``num_gpus``/``resources`` and the scheduling strategy of rank ``rank``."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        b = dict(self.bundles[rank])
        cpus, gpus = b.pop("CPU"), b.pop("GPU", 0.0)
        return {
            "num_cpus": cpus,
            "num_gpus": gpus,
            "resources": b or None,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=rank),
        }

    def rendezvous(self, timeout_s: float) -> tuple[str, int]:
        """Rank 0's node address and a TCP port free there now."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        probe = ray.remote(_endpoint).options(
            num_cpus=0, scheduling_strategy=PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=0)
        )
        try:
            address, port = ray.get(probe.remote(), timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise InfraError(f"no answer from learner rank 0's node within {timeout_s:.0f} s (finding its address)") from None
        return str(address), int(port)

    def release(self) -> None:
        """Free the reserved resources (the actors in it should be gone first)."""
        import ray
        from ray.util.placement_group import remove_placement_group

        if self.group is not None and ray.is_initialized():
            try:
                remove_placement_group(self.group)
            except Exception:  # already removed, or the cluster is gone
                pass
        self.group = None


class SharedPlacement(LearnerPlacement):
    """Colocated placement on GPUs: one bundle per GPU (``{"GPU": 1, "CPU": ...}``), holding
    learner rank ``i`` and generator ``i`` together, each with half of the bundle's GPU in Ray's
    accounting (both see the same device; they take turns with it: the generator sleeps while the
    learner trains).

    The reservation outlives learner restarts (the generators stay in it): :meth:`release` keeps
    it, :meth:`close` frees it at the end of the run."""

    SHARE = 0.5
    """Ray's GPU share of each of the two actors in a bundle."""

    def __init__(self, num_pairs: int, cpus_per_pair: float, resources: dict[str, float], timeout_s: float) -> None:
        super().__init__(learner_bundles(num_pairs, cpus_per_pair, 1.0, resources), timeout_s)
        self._learner_cpus: float | None = None

    def with_learner_cpus(self, num_cpus: float) -> SharedPlacement:
        """Use ``num_cpus`` of each bundle for the learner rank (the rest is the generator's)."""
        self._learner_cpus = num_cpus
        return self

    def options(self, rank: int) -> dict[str, Any]:
        opts = super().options(rank)
        opts["num_gpus"] = self.SHARE
        if self._learner_cpus is not None:
            opts["num_cpus"] = self._learner_cpus
        return opts

    def generator_options(self, index: int, num_cpus: float) -> dict[str, Any]:
        """Ray options that put generator ``index`` in bundle ``index`` (beside learner rank
        ``index``) with ``num_cpus`` CPUs and its GPU share."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return {
            "num_cpus": num_cpus,
            "num_gpus": self.SHARE,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=index),
        }

    def release(self) -> None:
        """Kept: the generators live in the same bundles (see :meth:`close`)."""

    def close(self) -> None:
        """Free the reservation (the actors in it should be gone first)."""
        super().release()
