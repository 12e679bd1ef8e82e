from agentrl.engine.loop.staleness import StalenessQueue
from agentrl.engine.common.trajectory import Trajectory


def traj(version: int, group: str = "g", i: int = 0, prompt: int = 0) -> Trajectory:
    return Trajectory(
        tokens=[1, 2, 3],
        loss_mask=[0, 1, 1],
        behaviour_logprobs=[0.0, -1.0, -1.0],
        versions=[-1, version, version + 1],
        reward=1.0,
        group_id=group,
        sample_index=i,
        prompt_index=prompt,
    )


def test_admission_bound():
    q = StalenessQueue(batch_size=4, group_size=2, max_staleness=1)
    started = 0
    while q.can_start():
        q.mark_started()
        started += 2
    assert started == (0 + 1 + 1) * 4  # (learner_version + max_staleness + 1) * batch_size
    q.advance(1)
    assert q.can_start()


def test_admission_waits_for_the_generators_to_serve_a_version():
    """While version 1 loads into the generators (the learner already holds it), samples that
    started now would be written by version 0: the window opens only once 1 is served."""
    q = StalenessQueue(batch_size=4, group_size=2, max_staleness=1)
    while q.can_start():
        q.mark_started()
    q.advance(1, served=False)
    assert q.learner_version == 1 and q.served_version == 0
    assert not q.can_start()
    q.serve(1)
    assert q.can_start()
    q.serve(0)  # an older announcement never lowers it
    assert q.served_version == 1


def test_sync_admission_is_one_batch():
    q = StalenessQueue(batch_size=4, group_size=2, max_staleness=0)
    q.mark_started()
    q.mark_started()
    assert not q.can_start()


def test_stale_groups_are_dropped_not_trained():
    q = StalenessQueue(batch_size=2, group_size=2, max_staleness=1)
    q.put([traj(0, "a", 0), traj(0, "a", 1)])
    q.put([traj(2, "b", 0), traj(2, "b", 1)])
    q.advance(2)  # group a's oldest token is 2 versions old
    assert q.ready()
    batch = q.take_batch()
    assert [t.group_id for g in batch for t in g] == ["b", "b"]
    assert q.stats.dropped_stale == 2
    assert q.stats.taken == 2 and q.stats.trained == 0  # trained: what reaches the loss (mark_trained)


def test_oldest_version_uses_model_tokens_only():
    t = traj(3)
    assert t.oldest_version == 3 and t.newest_version == 4


def test_mark_lost_returns_admission():
    q = StalenessQueue(batch_size=2, group_size=2, max_staleness=0)
    q.mark_started()
    assert not q.can_start()
    q.mark_lost(2)
    assert q.can_start()


def test_stalest_groups_are_trained_first():
    q = StalenessQueue(batch_size=2, group_size=2, max_staleness=1)
    q.put([traj(1, "new", 0), traj(1, "new", 1)])
    q.put([traj(0, "slow", 0), traj(0, "slow", 1)])  # finished later, generated earlier
    q.advance(1)
    batch = q.take_batch()
    assert [t.group_id for g in batch for t in g] == ["slow", "slow"]
    assert len(q) == 2


def test_batch_comes_in_prompt_order_whatever_the_arrival_order():
    q = StalenessQueue(batch_size=4, group_size=2, max_staleness=1)
    q.put([traj(0, "p7", 1, prompt=7), traj(0, "p7", 0, prompt=7)])
    q.put([traj(0, "p3", 0, prompt=3), traj(0, "p3", 1, prompt=3)])
    batch = q.take_batch()
    assert [(t.prompt_index, t.sample_index) for g in batch for t in g] == [(3, 0), (3, 1), (7, 0), (7, 1)]
