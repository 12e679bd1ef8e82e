"""Rank layout of the weight-transfer group, without Ray or vLLM."""

import pytest

from agentrl.engine.generation.weight_transfer import rank_offsets
from agentrl.errors import WeightSyncError

SLACK_S = 3.0
"""Seconds a bounded wait may overrun its bound here (thread start and join, a loaded 2-core machine)."""


def test_each_generator_gets_its_own_ranks():
    assert rank_offsets(2, 1) == [1]
    assert rank_offsets(3, 2) == [1, 2]  # two single-worker generators: ranks 1 and 2, not 1 and 1
    assert rank_offsets(9, 4) == [1, 3, 5, 7]  # tensor-parallel size 2
    assert rank_offsets(17, 2) == [1, 9]  # TP 8 on two nodes


@pytest.mark.parametrize("world, gens", [(1, 1), (4, 2), (3, 0), (2, 2)])
def test_a_group_that_cannot_hold_equal_generators_is_refused(world, gens):
    with pytest.raises(WeightSyncError, match="cannot hold"):
        rank_offsets(world, gens)


def test_a_blocked_collective_is_aborted_within_its_bound():
    """NCCL broadcasts have no timeout: the watchdog gives up after its bound, aborts the group
    (which releases the blocked call) and says what did not finish."""
    import threading
    import time

    from agentrl.engine.generation.weight_transfer import run_bounded

    released = threading.Event()
    aborted = []

    def blocked_broadcast() -> None:  # a peer that never joins: only an abort ends it
        released.wait(60)

    def abort() -> None:
        aborted.append(time.monotonic())
        released.set()

    t0 = time.monotonic()
    with pytest.raises(WeightSyncError, match="sending version 3 did not finish within 1 s; the transfer group was aborted"):
        run_bounded(blocked_broadcast, 1.0, abort, "sending version 3")
    elapsed = time.monotonic() - t0
    # aborted once, after its bound and not before; given up at once after it, not the 60 s the call would block
    assert len(aborted) == 1 and aborted[0] - t0 >= 1.0
    assert elapsed < 1.0 + SLACK_S, elapsed
    t0 = time.monotonic()
    assert run_bounded(lambda: 7, 5.0, abort, "x") == 7 and len(aborted) == 1
    assert time.monotonic() - t0 < SLACK_S  # a call that returns is not held until the bound
    with pytest.raises(ZeroDivisionError):
        run_bounded(lambda: 1 / 0, 5.0, abort, "x")


def test_learner_send_weights_is_bounded_and_drops_the_group(tiny_calc_model):
    """The learner's send on a group whose broadcast hangs (an NCCL peer died mid-update):
    a WeightSyncError within the bound, the group torn down, the next send refused clearly."""
    import threading
    import time

    from agentrl.engine.training.weight_export import WeightSender
    from tests.engine.training.test_learner_correctness import make_learner

    class HangingTransfer:
        def __init__(self) -> None:
            self.down = threading.Event()

        def send_weights(self) -> None:
            self.down.wait(120)

        def shutdown(self) -> None:
            self.down.set()

    learner = make_learner(str(tiny_calc_model))
    try:
        hanging = HangingTransfer()
        # a connected sender whose group is the hanging one (the seam vLLM's engine plugs into)
        learner.sender = WeightSender(learner.rank, learner.device)
        learner.sender._transfer, learner.sender._timeout_s = hanging, 1.0
        t0 = time.monotonic()
        with pytest.raises(WeightSyncError, match="rank 0: sending version 1 did not finish within 1 s; the transfer group was aborted"):
            learner.send_weights(1)
        elapsed = time.monotonic() - t0
        assert 1.0 <= elapsed < 1.0 + SLACK_S, elapsed  # its bound, not the 120 s the broadcast would hang
        assert hanging.down.is_set() and not learner.sender.connected
        with pytest.raises(WeightSyncError, match="no weight-transfer group"):
            learner.send_weights(2)
    finally:
        learner.shutdown()
