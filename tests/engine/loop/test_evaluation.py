"""Held-out evaluation: ReTool's measurements of tool use, and further named held-out sets."""

from __future__ import annotations

from typing import Any

import anyio

from agentrl.engine.common.trajectory import Trajectory
from agentrl.engine.loop.evaluation import Evaluator, eval_sets, summarise
from agentrl.engine.metrics import MetricsLogger, read_metrics
from agentrl.engine.testing import local_actor


def episode(*, reward: float, calls: int, errors: int, generated: int = 3, status: str = "ok", group: str = "g") -> Trajectory:
    n = 5 + generated
    return Trajectory(
        tokens=list(range(n)), loss_mask=[0] * 5 + [1] * generated, behaviour_logprobs=[0.0] * n,
        versions=[-1] * 5 + [0] * generated, reward=reward, group_id=group, sample_index=0, prompt_index=0, status=status,
        metrics={"tool_calls": float(calls), "tool_errors": float(errors), "generated_tokens": float(generated), "turns": calls + 1.0},
    )


def test_the_tool_use_measurements_count_calls_errors_and_recoveries():
    trajs = [
        episode(reward=1.0, calls=2, errors=1, generated=10),  # a failed block, then solved: a recovery
        episode(reward=0.0, calls=3, errors=2, generated=20),  # failed blocks, not solved
        episode(reward=1.0, calls=1, errors=0, generated=30),
        episode(reward=0.0, calls=0, errors=0, generated=40),  # answered without the tool
        episode(reward=1.0, calls=9, errors=9, generated=99, status="infra_failure"),  # kept out of every number
    ]
    m = summarise(trajs)
    assert m["episodes"] == 4
    assert m["tool_call_rate"] == 3 / 4
    assert m["tool_calls_mean"] == 6 / 4
    assert m["tool_error_rate"] == 3 / 6  # failed calls over calls, not episodes
    assert m["tool_error_episodes"] == 2
    assert m["recovery_rate"] == 1 / 2
    assert m["response_tokens_mean"] == (10 + 20 + 30 + 40) / 4


def test_without_tool_calls_the_rates_are_zero_not_a_division_by_zero():
    m = summarise([episode(reward=1.0, calls=0, errors=0)])
    assert m["tool_error_rate"] == 0.0 and m["recovery_rate"] == 0.0 and m["tool_error_episodes"] == 0


class _Worker:
    """A rollout worker whose episodes are solved when the row says so; records the group ids."""

    def __init__(self) -> None:
        self.groups: list[str] = []

    async def run_group(self, row: dict[str, Any], index: int, group_id: str, n: int, sampling: dict[str, Any], score: bool = True) -> list[Trajectory]:
        self.groups.append(group_id)
        return [episode(reward=float(row["solved"]), calls=1, errors=0, group=group_id)]


def test_further_sets_are_played_with_the_same_weights_and_logged_under_their_name(tmp_path):
    worker = _Worker()
    log = MetricsLogger(tmp_path, live=False)
    rows = [{"solved": 1}] * 4
    ood = [{"solved": 1}, {"solved": 0}, {"solved": 0}]
    evaluator = Evaluator(workers=lambda: [local_actor(worker, "rollout-0")], rows=rows, temperature=0.0, timeout_s=30, log=log,
                          samples_path=tmp_path / "eval_samples.jsonl", sets={"ood": ood})
    rec = anyio.run(evaluator, 3)
    log.close()
    assert rec["accuracy"] == 1.0 and rec["episodes"] == 4
    assert rec["ood/accuracy"] == 1 / 3 and rec["ood/episodes"] == 3 and rec["ood/tool_call_rate"] == 1.0
    assert len(set(worker.groups)) == 7  # the sets' episodes never share a group id
    [logged] = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["kind"] == "eval"]
    assert logged["ood/accuracy"] == 1 / 3 and eval_sets([logged]) == ["ood"]


def test_eval_sets_are_named_in_first_seen_order():
    assert eval_sets([{"accuracy": 1.0}, {"accuracy": 0.5, "ood/accuracy": 0.1, "hard/accuracy": 0.0}]) == ["ood", "hard"]
