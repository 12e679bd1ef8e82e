"""Kill a run with SIGKILL mid-way, resume it, and check that no prompt is lost or trained twice.

The evidence is the learner's own append-only audit (what rank 0 trained on, step by step, in
both processes) and the rollout workers' record of every finished episode, not the controller's
summary (which a resume rewrites)."""

import json
import os
import subprocess
from collections import defaultdict

import pytest

from agentrl.engine.audit import episodes_audit_path, learner_audit_path, read_audit
from tests.e2e.helpers import REPO, run_then_kill, steps, train_cmd

BATCH, GROUP, STALENESS = 8, 4, 1  # learner.batch_size below; tiny_calc's group size and staleness bound


def _prompt(sample_id: str) -> int:
    """``"p12/3"`` (or a retry's ``"p12-1/3"``) -> 12."""
    return int(sample_id.split("/")[0][1:].split("-")[0])


def _cmd(run_dir, model):
    return train_cmd(
        run_dir, model,
        "sft.steps=0",
        "eval.limit=0",
        "learner.max_degenerate_steps=0",  # the untrained model earns no reward on Calc: every step is degenerate, on purpose here
        "learner.max_steps=5",
        "learner.batch_size=8",
        "rollout.max_new_tokens=16",
        "checkpoint.every_steps=1",
        "checkpoint.keep=2",
    )


@pytest.mark.e2e
@pytest.mark.vllm
def test_sigkill_and_resume_loses_no_prompt(tmp_path, tiny_calc_model):
    run_dir = tmp_path / "run"
    env = {**os.environ, "RAY_DEDUP_LOGS": "0"}
    killed_at = run_then_kill(_cmd(run_dir, tiny_calc_model), run_dir, tmp_path / "first.log")
    assert killed_at < 5

    second = subprocess.run(_cmd(run_dir, tiny_calc_model), cwd=REPO, capture_output=True, text=True, timeout=900, env=env)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-5000:]
    assert "resuming from" in second.stderr

    done = steps(run_dir)
    assert done == [1, 2, 3, 4, 5], done  # step and version continue, lost steps are redone once
    trained = [json.loads(line) for line in (run_dir / "trained.jsonl").read_text().splitlines()]
    assert [t["step"] for t in trained] == [1, 2, 3, 4, 5]
    prompts = [p for t in trained for p in t["prompts"]]
    assert len(prompts) == len(set(prompts)), f"a prompt was trained twice: {prompts}"
    # no prompt lost: every issued prompt index is trained exactly once, or still untrained
    # (queued or in flight) at the end, or counted as dropped for staleness
    summary = json.loads((run_dir / "summary.json").read_text())
    accounted = prompts + summary["untrained_prompts"] + summary["dropped_prompts"] + summary["abandoned_prompts"]
    assert sorted(accounted) == list(range(summary["prompt_cursor"])), (prompts, summary)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(r["dropped_stale"] == 0 for r in records if r["kind"] == "step")
    assert (run_dir / "final" / "model.safetensors").exists()
    _check_audit(run_dir, summary, killed_at)


def _check_audit(run_dir, summary, killed_at):
    """The same claims from the learner's and rollout workers' append-only records."""
    audit = read_audit(learner_audit_path(run_dir))
    pids = list(dict.fromkeys(rec["pid"] for rec in audit))
    assert len(pids) == 2, f"expected the killed learner and the resumed one, got pids {pids}"
    killed, resumed = ([rec for rec in audit if rec["pid"] == pid] for pid in pids)
    # the killed learner trained steps 1..k in order; the resumed one continued from a checkpoint
    assert [rec["step"] for rec in killed] == list(range(1, len(killed) + 1))
    assert len(killed) >= killed_at  # every step the controller logged, the learner had trained
    checkpoint = resumed[0]["step"] - 1
    assert 1 <= checkpoint <= len(killed)
    assert [rec["step"] for rec in resumed] == list(range(checkpoint + 1, 6))
    timeline = killed[:checkpoint] + resumed  # what the final weights were trained on
    rolled_back = killed[checkpoint:]  # trained, then lost with the kill: must be trained again

    ids = [s["id"] for rec in timeline for s in rec["samples"]]
    assert None not in ids and len(ids) == len(set(ids)), f"a sample was trained twice: {ids}"
    per_step = [{_prompt(i) for i in (s["id"] for s in rec["samples"])} for rec in timeline]
    trained = set().union(*per_step)
    assert sum(map(len, per_step)) == len(trained), f"a prompt was trained in two steps: {per_step}"
    assert all(len(p) == BATCH // GROUP for p in per_step), per_step
    # the labels agree with the tokens: one prompt digest per prompt index, and a distinct
    # digest per prompt index (the dataset's questions are distinct)
    digests = defaultdict(set)
    for rec in audit:
        for s in rec["samples"]:
            digests[_prompt(s["id"])].add(s["prompt_sha1"])
    assert all(len(d) == 1 for d in digests.values()), digests
    assert len({next(iter(d)) for d in digests.values()}) == len(digests)

    episodes = [e for e in read_audit(episodes_audit_path(run_dir)) if e["id"].startswith("p")]
    finished = defaultdict(set)
    for e in episodes:
        finished[e["prompt"]].add(e["id"])
    trainable = {e["id"] for e in episodes if e["status"] != "infra_failure"}
    assert set(ids) <= trainable, "the learner trained a sample no rollout worker finished"
    # no prompt lost: every prompt the final run issued (below its cursor) whose whole group
    # finished is trained once, or still waiting at the end — and what waits is bounded by the
    # staleness window, so "waiting" cannot hide lost prompts
    waiting = set(summary["untrained_prompts"])
    assert summary["dropped_prompts"] == [] and summary["abandoned_prompts"] == []
    assert len(waiting) <= (STALENESS + 1) * BATCH // GROUP, waiting
    assert not waiting & trained
    complete = {p for p, got in finished.items() if len(got) >= GROUP and p < summary["prompt_cursor"]}
    assert complete - trained <= waiting, sorted(complete - trained - waiting)
    assert trained <= complete
    # the rewind lost nothing: the rolled-back steps' prompts were trained again or still wait
    again = {_prompt(s["id"]) for rec in rolled_back for s in rec["samples"]}
    assert again <= trained | waiting, sorted(again - trained - waiting)
