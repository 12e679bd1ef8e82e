"""The generator router's load counts across a change of the generator set."""

from __future__ import annotations

from agentrl.engine.episodes.routing import GeneratorRouter


def test_a_group_in_flight_across_a_shrinking_generator_set_releases_without_error():
    router = GeneratorRouter(["g0", "g1", "g2"], generate_timeout_s=1.0)
    with router.reserved(2, 100):  # a group pinned to generator 2 ...
        with router.reserved(0, 40):
            router.set_generators(["g0", "g1"])  # ... which leaves the set while the group runs
            assert router.outstanding == [40, 0]  # generator 0's load still counts
        assert router.outstanding == [0, 0]
    assert router.outstanding == [0, 0]  # generator 2's reservation is dropped, not an IndexError


def test_a_growing_set_keeps_the_counts_of_the_generators_that_remain():
    router = GeneratorRouter(["g0"], generate_timeout_s=1.0)
    with router.reserved(0, 30):
        router.set_generators(["g0", "g1"])
        assert router.outstanding == [30, 0]
        assert router.pick() == 1  # the new, idle generator takes the next group
    assert router.outstanding == [0, 0]
