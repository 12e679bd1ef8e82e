"""The prompt ledger's accounting of lost groups: infrastructure failures and agent failures apart."""

from __future__ import annotations

from agentrl.engine.loop.ledger import Outcome, PromptLedger
from agentrl.engine.loop.staleness import StalenessQueue
from agentrl.engine.common.trajectory import Trajectory


def episode(status: str, i: int = 0) -> Trajectory:
    return Trajectory(tokens=[1, 2], loss_mask=[0, 1], behaviour_logprobs=[0.0, -1.0], versions=[-1, 0], reward=0.0,
                      group_id="p0", sample_index=i, prompt_index=0, status=status, info={"error": f"{status} here"})


def test_a_group_lost_to_its_agent_is_counted_as_agent_failures_and_reissued():
    ledger = PromptLedger(num_rows=4, group_size=2)
    ledger.issue("k")
    assert ledger.finish("k", [episode("agent_failure", 0), episode("agent_failure", 1)]) is Outcome.RETRY
    assert ledger.agent_failures == 2 and ledger.infra_failures == 0
    assert "in the agent program" in ledger.last_error and "agent_failure here" in ledger.last_error
    ledger.issue("k2")
    assert ledger.finish("k2", [episode("ok", 0), episode("infra_failure", 1)]) is Outcome.QUEUED
    assert ledger.agent_failures == 2 and ledger.infra_failures == 1
    state = ledger.snapshot(0, StalenessQueue(batch_size=2, group_size=2, max_staleness=1), [])
    restored = PromptLedger.restore(state, StalenessQueue(batch_size=2, group_size=2, max_staleness=1), num_rows=4, group_size=2)
    assert (restored.agent_failures, restored.infra_failures) == (2, 1)


RAY_ACTOR_DIED = ("The actor died unexpectedly before finishing this task.\n\tclass_name: RolloutWorker\n"
                  "\tactor_id: 5f1c0e\n\tpid: 4242\n\tnamespace: agentrl\n\tip: 127.0.0.1\n"
                  "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR")
AGENT_TRACEBACK = "Traceback (most recent call last):\n  File \"agent.py\", line 9, in run\n    1 / 0\nZeroDivisionError: division by zero\n"


def test_a_lost_groups_line_is_one_line_of_the_error_not_rays_paragraph_or_a_traceback():
    ledger = PromptLedger(num_rows=4, group_size=2)
    ledger.issue("k")
    ledger.finish("k", [], error=f"RayActorError: {RAY_ACTOR_DIED}")
    assert ledger.last_error == "group p0 failed on infrastructure (RayActorError: The actor died unexpectedly before finishing this task.)"
    ledger.issue("k2")
    ledger.finish("k2", [episode("agent_failure", 0), episode("agent_failure", 1)], error=AGENT_TRACEBACK)
    assert ledger.last_error.endswith("failed in the agent program (ZeroDivisionError: division by zero)")
    assert "\n" not in ledger.last_error
