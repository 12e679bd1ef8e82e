"""The chaos invariants (tests/e2e/helpers.audit_violations), checked against audit logs written
here with the engine's own AuditLog: a run whose learner was restarted from a checkpoint keeps
them; each way of breaking one is named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentrl.engine.common.audit import AuditLog, episodes_audit_path, learner_audit_path
from tests.e2e.helpers import audit_violations, trained_timeline

GROUP, BATCH = 2, 4  # two prompts a step


def sample(prompt: int, i: int, retry: str = "") -> dict[str, Any]:
    return {"id": f"p{prompt}{retry}/{i}", "prompt_sha1": f"sha{prompt:04d}", "tokens": 10}


def step(n: int, prompts: list[int]) -> dict[str, Any]:
    return {"step": n, "samples": [sample(p, i) for p in prompts for i in range(GROUP)]}


def write(run_dir: Path, steps: list[dict[str, Any]], *, episodes: list[tuple[int, str]] | None = None) -> None:
    """Learner records ``steps`` in order, and a finished episode for each sample of each prompt
    0..11 (``episodes``: ``(prompt, status)`` instead)."""
    learner = AuditLog(learner_audit_path(run_dir))
    for rec in steps:
        learner.append(rec)
    eps = AuditLog(episodes_audit_path(run_dir))
    for prompt, status in episodes if episodes is not None else [(p, "ok") for p in range(12)]:
        for i in range(GROUP):
            eps.append({"id": f"p{prompt}/{i}", "prompt": prompt, "status": status, "reward": 0.0})


def summary(cursor: int = 10, waiting: list[int] | None = None, **kw: Any) -> dict[str, Any]:
    return {"prompt_cursor": cursor, "untrained_prompts": waiting if waiting is not None else [8, 9], "dropped_prompts": [],
            "abandoned_prompts": [], **kw}


def check(run_dir: Path, s: dict[str, Any], max_steps: int = 4) -> list[str]:
    return audit_violations(run_dir, s, max_steps=max_steps, group=GROUP, staleness=1, batch=BATCH)


#: steps 1..3, the learner killed, restarted from the checkpoint of step 2: steps 3 and 4 again
RESTARTED = [step(1, [0, 1]), step(2, [2, 3]), step(3, [4, 5]), step(3, [4, 5]), step(4, [6, 7])]


def test_a_restarted_learner_keeps_every_invariant(tmp_path):
    write(tmp_path, RESTARTED)
    timeline, rolled_back = trained_timeline(tmp_path)
    assert [r["step"] for r in timeline] == [1, 2, 3, 4] and [r["step"] for r in rolled_back] == [3]
    assert check(tmp_path, summary()) == []


def test_a_run_that_stopped_short_of_max_steps(tmp_path):
    write(tmp_path, RESTARTED[:3])
    assert any("did not reach max_steps = 4" in v for v in check(tmp_path, summary(waiting=[6, 7, 8, 9])))


def test_a_sample_trained_twice(tmp_path):
    write(tmp_path, [*RESTARTED[:4], step(4, [6, 0])])
    said = check(tmp_path, summary(waiting=[7, 8, 9]))
    assert any(v.startswith("samples trained twice: ['p0/0', 'p0/1']") for v in said), said


def test_a_trained_sample_no_worker_finished(tmp_path):
    write(tmp_path, RESTARTED, episodes=[(p, "infra_failure" if p == 6 else "ok") for p in range(12)])
    said = check(tmp_path, summary())
    assert any(v.startswith("trained samples no rollout worker recorded as finished: ['p6/0'") for v in said), said


def test_a_prompt_below_the_cursor_lost(tmp_path):
    write(tmp_path, RESTARTED)
    said = check(tmp_path, summary(waiting=[9]))
    assert any("neither trained nor accounted for: [8]" in v for v in said), said


def test_a_prompt_said_abandoned_without_infrastructure_failures(tmp_path):
    write(tmp_path, RESTARTED, episodes=[(p, "infra_failure" if p == 9 else "ok") for p in range(12)])
    assert check(tmp_path, summary(waiting=[], abandoned_prompts=[9], dropped_prompts=[8])) == []
    said = check(tmp_path, summary(waiting=[9], abandoned_prompts=[8]))
    assert any(v.startswith("prompts said abandoned whose episodes did not all fail on infrastructure: [8]") for v in said), said


def test_critic_warm_up_steps_train_no_policy(tmp_path):
    """PPO's first ``critic.warmup_steps`` steps train the critic only: the learner records none."""
    write(tmp_path, RESTARTED[1:])
    assert check(tmp_path, summary(), max_steps=4) != []
    assert audit_violations(tmp_path, summary(), max_steps=4, group=GROUP, staleness=1, batch=BATCH, warmup_steps=1) == []
