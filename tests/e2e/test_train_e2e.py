"""`agentrl train` for real: Ray, vLLM (CPU), FSDP2 (gloo), bubblewrap, end to end, with versions
broadcast over gloo and a generator lost mid-run. (Two generators in one gloo group, with a
checkpoint and a resume over gloo: test_resume_e2e.py.)"""

import json
import os
import subprocess

import pytest

from agentrl.engine.common.audit import episodes_audit_path, learner_audit_path, read_audit

from tests.e2e.helpers import REPO, fault_train_cmd

SMALL_RUN = (
    "learner.batch_size=8",
    "rollout.group_size=4",
    "rollout.max_new_tokens=24",
    "data.limit=64",
    "sft.steps=0",
    "eval.limit=0",
    "learner.max_degenerate_steps=0",  # the untrained model earns no reward on Calc: every step is degenerate, on purpose here
)
"""Overrides of the run here (and of the PPO run): 8 samples per step (groups of 4), short turns, no SFT, no evaluation."""


@pytest.mark.e2e
@pytest.mark.vllm
def test_gloo_weight_sync_and_its_fallback_to_disk(tmp_path, tiny_calc_model):
    """``weight_sync = "gloo"``: versions are broadcast into the vLLM workers (nothing written);
    when a generator is lost (killed after step 3, as if its node died) the group is gone, the run
    says so, replaces the generator, keeps the episodes it lost out of the loss, goes on through
    disk and finishes with a final model transformers loads. (One run covers both: the plain
    run's checks, formerly test_train_tiny_calc_end_to_end, are the ones after the gloo block.)"""
    run_dir = tmp_path / "run"
    cmd = fault_train_cmd(
        run_dir, tiny_calc_model, 3,
        "generator.weight_sync='gloo'",
        "generator.weight_sync_timeout_s=60",
        "learner.max_steps=5",
        *SMALL_RUN,
    )
    env = {**os.environ, "RAY_DEDUP_LOGS": "0"}
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]

    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["kind"] == "step"]
    assert [s["version"] for s in steps] == [1, 2, 3, 4, 5]
    events = [r["message"] for r in records if r["kind"] == "event"]
    assert any(e.startswith("weight sync: gloo broadcast") for e in events), events
    # the first versions went over the group: never written, but generated with
    assert max(s["max_token_version"] for s in steps[:3]) >= 1
    assert not (run_dir / "weights" / "v000001").exists()
    # generator 0 is killed after step 3: the group lost a member; the replacement starts from
    # the learner's current version (3 or 4, depending on which notices first), written for it,
    # and later versions go through disk
    assert any("weight sync over gloo" in e and ("ended" in e or "failed" in e) for e in events), events
    restarts = [int(e.split("restarted at version ")[1].split()[0]) for e in events if "generator 0 restarted at version" in e]
    assert restarts and min(restarts) >= 3, events
    assert (run_dir / "weights" / "v000005").is_dir()
    assert (run_dir / "final" / "config.json").is_file()

    for s in steps:
        assert s["samples"] == 8
        assert all(int(k) <= 1 for k in s["staleness_hist"])  # max_staleness = 1
    (util,) = [r for r in records if r["kind"] == "utilisation"]
    assert 0 < util["learner_busy_fraction"] <= 1 and 0 < util["generator_busy_fraction"] <= 1, util
    published = sorted(p.name for p in (run_dir / "weights").iterdir())
    assert len(published) >= 2, published  # the replacement's start version and the versions after it
    # the episodes the dead generator broke are kept out of the loss: the rollout workers
    # recorded them as infrastructure failures, and the learner's own audit never trained them
    episodes = read_audit(episodes_audit_path(run_dir))
    lost = {e["id"] for e in episodes if e["status"] == "infra_failure"}
    trained = [s["id"] for rec in read_audit(learner_audit_path(run_dir)) for s in rec["samples"]]
    assert lost, "the generator died with no episode in flight: nothing shows lost episodes kept out"
    assert trained and not lost & set(trained), sorted(lost & set(trained))
    assert set(trained) <= {e["id"] for e in episodes if e["status"] != "infra_failure"}

    from transformers import AutoModelForCausalLM, AutoTokenizer

    final = run_dir / "final"
    model = AutoModelForCausalLM.from_pretrained(final)
    tok = AutoTokenizer.from_pretrained(final)
    assert model.config.model_type == "qwen2"
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
