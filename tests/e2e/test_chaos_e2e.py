"""A short chaos run (issue 37), with the chaos harness's own code (tests/e2e/chaos.py, which
benchmarks/chaos.py runs 20 times on a random schedule): `agentrl train` on the tiny main job with
checkpoints every 2 steps; generator 0's process is SIGKILLed once step 2 is logged, then learner
rank 0's and the rollout worker's together once step 4 is. The run exits 0 with no traceback,
each death is replaced once (one event each), and the append-only audit logs hold every
invariant: steps 1..max_steps behind the final weights, no sample trained twice, every trained
sample from a finished episode, every prompt below the cursor trained or accounted for."""

from __future__ import annotations

import pytest

from tests.e2e.chaos import Fault, describe, run_with_faults
from tests.e2e.helpers import train_cmd

MAX_STEPS, BATCH, GROUP, STALENESS = 6, 8, 4, 1  # the overrides below; tiny_calc's group size and staleness bound


@pytest.mark.e2e
@pytest.mark.vllm
def test_three_kinds_of_sigkill_two_at_once_and_the_run_keeps_its_invariants(tmp_path, tiny_calc_model):
    run_dir = tmp_path / "run"
    cmd = train_cmd(
        run_dir, tiny_calc_model,
        "sft.steps=0", "eval.limit=0",
        "learner.max_degenerate_steps=0",  # the untrained model earns no reward on Calc: degenerate steps, on purpose
        f"learner.max_steps={MAX_STEPS}", f"learner.batch_size={BATCH}", "rollout.max_new_tokens=16",
        "checkpoint.every_steps=2",
    )
    faults = [Fault("generator", 2), Fault("learner", 4), Fault("rollout-worker", 4)]
    result = run_with_faults(cmd, run_dir, tmp_path / "run.log", faults, seed=0, max_steps=MAX_STEPS, group=GROUP,
                             staleness=STALENESS, batch=BATCH, timeout_s=900)
    assert all(f.pid is not None for f in faults), ([(f.kind, f.note) for f in faults], result.violations, result.console_tail)
    assert result.finished, (describe(faults), result.violations, result.console_tail)
    assert result.steps == MAX_STEPS
    assert result.restarts["generator_restarts"] == 1, result.restarts
    assert result.restarts["learner_restarts"] == 1, result.restarts
    assert result.restarts["rollout_worker_restarts"] == 1, result.restarts
