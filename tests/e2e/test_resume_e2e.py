"""Kill a run with SIGKILL mid-way, resume it, and check that no prompt is lost or trained twice.

The evidence is the learner's own append-only audit (what rank 0 trained on, step by step, in
both processes) and the rollout workers' record of every finished episode, not the controller's
summary (which a resume rewrites).

The run has two generators in one gloo weight-transfer group (``weight_sync = "gloo"``, each with
its own ranks): its checkpoints are written although no version folder exists (the learner writes
the checkpoint's weights), and the resumed invocation joins a new group and goes on over gloo,
never falling back to disk. (One run covers both, formerly this test and
test_gloo_weight_sync_with_two_generators_checkpoints_and_resumes: one pair of start-ups.)"""

import json
import os
import subprocess

import pytest

from tests.e2e.helpers import REPO, check_audit, placements, run_then_kill, steps, train_cmd

MAX_STEPS, BATCH, GROUP, STALENESS = 6, 8, 4, 1  # the overrides below; tiny_calc's group size and staleness bound


def _cmd(run_dir, model):
    return train_cmd(
        run_dir, model,
        "sft.steps=0",
        "eval.limit=0",
        "learner.max_degenerate_steps=0",  # the untrained model earns no reward on Calc: every step is degenerate, on purpose here
        f"learner.max_steps={MAX_STEPS}",
        f"learner.batch_size={BATCH}",
        "rollout.max_new_tokens=16",
        "checkpoint.every_steps=1",
        "checkpoint.keep=2",
        "generator.weight_sync='gloo'",
        "generator.weight_sync_timeout_s=60",
        "generator.num_generators=2",
        "generator.kv_cache_gib=0.5",
    )


def _over_gloo_only(records: list[dict], invocations: int) -> None:
    """Each of ``invocations`` invocations joined both generators to its gloo group, and no
    version ever fell back to disk."""
    events = [r["message"] for r in records if r["kind"] == "event"]
    joined = [e for e in events if e.startswith("weight sync: gloo broadcast from learner rank 0 to 2 generator workers")]
    assert len(joined) == invocations, events
    assert not any(r.get("weight_sync_fallbacks") for r in records), events  # never fell back to disk


@pytest.mark.e2e
@pytest.mark.vllm
def test_sigkill_and_resume_loses_no_prompt_with_two_generators_over_gloo(tmp_path, tiny_calc_model):
    run_dir = tmp_path / "run"
    env = {**os.environ, "RAY_DEDUP_LOGS": "0"}
    # killed once step 3 is logged: tokens of a version broadcast over gloo have reached the learner by then
    killed_at = run_then_kill(_cmd(run_dir, tiny_calc_model), run_dir, tmp_path / "first.log", min_step=3)
    assert killed_at < MAX_STEPS
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.endswith("}")]
    _over_gloo_only(records, 1)
    assert max(r["max_token_version"] for r in records if r["kind"] == "step") >= 1  # generated with a broadcast version
    checkpoints = sorted((run_dir / "checkpoints").glob("step_*"))
    assert checkpoints
    for ckpt in checkpoints:  # versions travelled over gloo only: the learner wrote each checkpoint's weights
        weights = ckpt / "weights"
        assert (weights / "model.safetensors").is_file() and (weights / "tokenizer_config.json").is_file()
    assert not (run_dir / "weights" / "v000002").exists()  # versions travelled over gloo only

    second = subprocess.run(_cmd(run_dir, tiny_calc_model), cwd=REPO, capture_output=True, text=True, timeout=900, env=env)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-5000:]
    assert "resuming from" in second.stderr

    done = steps(run_dir)
    assert done == list(range(1, MAX_STEPS + 1)), done  # step and version continue, lost steps are redone once
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    _over_gloo_only(records, 2)
    trained = [json.loads(line) for line in (run_dir / "trained.jsonl").read_text().splitlines()]
    assert [t["step"] for t in trained] == list(range(1, MAX_STEPS + 1))
    prompts = [p for t in trained for p in t["prompts"]]
    assert len(prompts) == len(set(prompts)), f"a prompt was trained twice: {prompts}"
    # no prompt lost: every issued prompt index is trained exactly once, or still untrained
    # (queued or in flight) at the end, or counted as dropped for staleness
    summary = json.loads((run_dir / "summary.json").read_text())
    accounted = prompts + summary["untrained_prompts"] + summary["dropped_prompts"] + summary["abandoned_prompts"]
    assert sorted(accounted) == list(range(summary["prompt_cursor"])), (prompts, summary)
    assert all(r["dropped_stale"] == 0 for r in records if r["kind"] == "step")
    assert (run_dir / "final" / "model.safetensors").exists()
    check_audit(run_dir, summary, killed_at=killed_at, max_steps=MAX_STEPS, batch=BATCH, group=GROUP, staleness=STALENESS)
    # both invocations ran colocated ("auto" on this CPU-only machine): the kill and the resume
    # are proven in the mode a laptop user gets
    assert placements(run_dir) and set(placements(run_dir)) == {"colocated"}, placements(run_dir)
