"""A user's first day, through the CLI (issue 36), in one `agentrl train` run (then two short
reruns of the same recipe, which start from the first run's SFT model with ``sft.steps=0``: what
they check is the start of a run, not its warm-up):

- their own environment module and their own reward functions (``[[reward.functions]]``, one
  async, one plain) beside their recipe, run from another directory without PYTHONPATH;
- the run checkpoints without being asked (after step 1); a rerun of the finished run says plainly
  that it starts a new one and keeps the old one aside; ``--resume-from`` goes on from a checkpoint
  of that old run;
- the learner's process is SIGKILLed twice from outside, as the OOM killer would: during the
  supervised stage, and in RL before the first checkpoint (the recipe's checkpoint settings are the
  shipped main job's, untouched); the run survives both in-run;
- the console, off a terminal and without COLUMNS: every line is one of agentrl's own (an
  allowlist of its line formats, or an event it logged); the first lines name the TensorBoard and
  report commands; one ready line per component; step lines carry an ETA from the second step; the
  degenerate-step warning keeps its literal brackets (``[sft]``: rich used to swallow them as
  markup); no line is wrapped."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.helpers import REPO, actor_pids, foreign_lines, kill_tree, steps
from tests.e2e.helpers import records as metrics_so_far
from agentrl.engine.common.audit import learner_audit_path, read_audit
from tests.test_user_code import USER_ENV

MAX_STEPS = 3
SFT_STEPS = 100  # the supervised stage's steps; its learner is killed once its first progress record (step 25) is logged

USER_REWARDS = '''
async def tagged(completion, messages, row):
    """0.25 when the function was given the real episode: the conversation starts with the row's
    question and ends with the model's turn."""
    ok = messages[0]["content"] == row["question"] and messages[-1]["role"] == "assistant" and isinstance(completion, str)
    return 0.25 if ok else -100.0


def has_answer(row, env_reward):
    return 0.125 if "answer" in row and env_reward >= 0.5 else -100.0
'''


def _events(run_dir: Path) -> list[str]:
    """The event messages of ``run_dir/metrics.jsonl``."""
    return [r["message"] for r in metrics_so_far(run_dir) if r["kind"] == "event"]


def _environ() -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "COLUMNS")}
    return {**environ, "RAY_DEDUP_LOGS": "0"}


def _train(recipe: Path, cwd: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "agentrl.cli", "train", str(recipe), *extra]
    return subprocess.run(cmd, cwd=cwd, env=_environ(), capture_output=True, text=True, timeout=900)


@dataclass
class FirstRun:
    """The first `agentrl train` of the user's project, and what the test did to it."""

    proj: Path
    elsewhere: Path
    recipe: Path
    run_dir: Path
    sets: list[str]
    returncode: int
    stdout: str
    console: str
    """What the run printed on stderr (the console)."""
    metrics: Path
    """A copy of the run's metrics.jsonl as it ended (the run directory is set aside later)."""
    sft_model: Path
    """A copy of the model its SFT stage wrote (``run/sft``), outside the run directory: the reruns' model."""
    sft_killed: list[int]
    """The learner processes killed during the supervised stage."""
    rl_killed: list[int]
    """The learner processes killed in RL before the first checkpoint."""
    learner_audit: list[dict]
    """The learner's append-only audit of the RL steps it trained."""


def _wait(proc: subprocess.Popen, err: Path, reached, what: str, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while not reached():
        assert proc.poll() is None, f"the run ended before {what}:\n" + err.read_text()[-5000:]
        assert time.monotonic() < deadline, f"the run never reached {what}"
        time.sleep(0.1)


def _kill(pids: list[int]) -> None:
    for pid in pids:
        os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def first_run(tmp_path_factory, tiny_calc_model) -> FirstRun:
    tmp = tmp_path_factory.mktemp("first_day")
    proj, elsewhere = tmp / "proj", tmp / "elsewhere"
    proj.mkdir()
    elsewhere.mkdir()
    (proj / "my_envs.py").write_text(USER_ENV)
    (proj / "my_rewards.py").write_text(USER_REWARDS)
    run_dir = proj / "run"
    base = (REPO / "recipes" / "tiny_calc.toml").read_text()
    recipe = proj / "recipe.toml"
    recipe.write_text(base.replace('path = "runs/models/tiny-calc"', f'path = "{tiny_calc_model}"')
                      .replace('id = "agentrl/Calc-v0"\nkwargs = { max_turns = 3 }', 'id = "my_envs:EchoEnv"\nkwargs = { bonus = 0.5 }')
                      .replace('name = "tiny_calc"', f'name = "first_day"\nrun_dir = "{run_dir}"')
                      + '\n[[reward.functions]]\nfn = "my_rewards:tagged"\n\n[[reward.functions]]\nfn = "my_rewards:has_answer"\nweight = 2\n')
    assert "my_envs:EchoEnv" in recipe.read_text() and str(run_dir) in recipe.read_text()
    assert "[checkpoint]" not in recipe.read_text()  # the main job's checkpoint defaults, untouched
    sets = ["--set", f"sft.steps={SFT_STEPS}", "--set", "sft.batch_size=4", "--set", "eval.limit=0",
            "--set", "learner.max_degenerate_steps=0", "--set", f"learner.max_steps={MAX_STEPS}",
            "--set", "learner.batch_size=8", "--set", "rollout.max_new_tokens=16"]

    out, err = tmp / "first.out", tmp / "first.err"
    cmd = [sys.executable, "-m", "agentrl.cli", "train", str(recipe), *sets]
    with open(out, "w") as o, open(err, "w") as e:
        proc = subprocess.Popen(cmd, cwd=elsewhere, env=_environ(), stdout=o, stderr=e, text=True, start_new_session=True)
    try:
        # during the supervised stage: the learner's process, once SFT step 25 is logged
        _wait(proc, err, lambda: any(r["kind"] == "sft" for r in metrics_so_far(run_dir)), "SFT step 25")
        sft_killed = actor_pids(run_dir, "learner-0")
        assert len(sft_killed) == 1, sft_killed
        assert not any(m.startswith("SFT done") for m in _events(run_dir)), "the stage ended before the kill"
        _kill(sft_killed)
        sft_learners = set(sft_killed)

        def sft_done() -> bool:
            sft_learners.update(actor_pids(run_dir, "learner-0"))  # the stage's restarted learner
            return any(m.startswith("SFT done") for m in _events(run_dir))

        _wait(proc, err, sft_done, "the end of the SFT stage")
        # in RL, before the first checkpoint (written after step 1): the learner's process, once it is ready
        _wait(proc, err, lambda: any(m.startswith("learner ready:") for m in _events(run_dir)), "the RL learner ready")
        rl_killed = sorted(set(actor_pids(run_dir, "learner-0")) - sft_learners)
        assert len(rl_killed) == 1, (rl_killed, sft_learners)
        assert not steps(run_dir) and not list(run_dir.glob("checkpoints/step_*")), "step 1 was done before the kill"
        _kill(rl_killed)
        rc = proc.wait(timeout=900)
    finally:
        if proc.poll() is None:
            kill_tree(proc)
    snapshot = tmp / "first_metrics"
    snapshot.mkdir()
    shutil.copy(run_dir / "metrics.jsonl", snapshot / "metrics.jsonl")
    sft_model = tmp / "sft_model"
    if (run_dir / "sft" / "config.json").is_file():
        shutil.copytree(run_dir / "sft", sft_model)
    audit = read_audit(learner_audit_path(run_dir)) if learner_audit_path(run_dir).exists() else []
    return FirstRun(proj, elsewhere, recipe, run_dir, sets, rc, out.read_text(), err.read_text(), snapshot / "metrics.jsonl",
                    sft_model, sft_killed, rl_killed, audit)


@pytest.mark.e2e
@pytest.mark.vllm
def test_the_learner_killed_during_sft_and_before_the_first_checkpoint_is_survived_in_run(first_run):
    run = first_run
    assert run.returncode == 0, run.stdout[-2000:] + run.console[-5000:]
    assert "Traceback" not in run.console and "(raylet)" not in run.console, run.console[-5000:]
    records = [json.loads(line) for line in run.metrics.read_text().splitlines()]
    events = [r["message"] for r in records if r["kind"] == "event"]
    restarts = [r["message"] for r in records if r["kind"] == "event" and r.get("learner_restarts")]
    assert len(restarts) == 2, events
    # the supervised stage began again from its model, and finished
    assert "died" in restarts[0] and "restarting the SFT stage from" in restarts[0] and "at step 0" in restarts[0], restarts
    sft_steps = [r["step"] for r in records if r["kind"] == "sft"]
    again = len(sft_steps) - 1 - sft_steps[::-1].index(25)  # the restarted stage's first record
    assert sft_steps[:again] in ([25], [25, 50]) and sft_steps[again:] == list(range(25, SFT_STEPS + 1, 25)), sft_steps
    assert sum(m.startswith("SFT done") for m in events) == 1, events
    # RL: no checkpoint yet, the learner restarted from the RL starting point (the SFT model) at step 0
    assert "died" in restarts[1] and "no checkpoint yet: restarting the learner from the RL starting point at step 0" in restarts[1], restarts
    assert "the learner restarted at step 0; generators serve the starting weights again" in events, events
    assert [r["step"] for r in records if r["kind"] == "step"] == list(range(1, MAX_STEPS + 1))
    # the learner audit: every RL step was trained once, by the process that took over (the killed one trained none)
    assert [a["step"] for a in run.learner_audit] == list(range(1, MAX_STEPS + 1)), run.learner_audit
    assert {a["pid"] for a in run.learner_audit}.isdisjoint(run.sft_killed + run.rl_killed)
    # both deaths said in one plain console line each (Ray's own paragraph goes to the run's logs)
    lines = run.console.splitlines()
    assert sum("restarting the SFT stage from" in line for line in lines) == 1, lines
    assert sum("restarting the learner from the RL starting point" in line for line in lines) == 1, lines


@pytest.mark.e2e
@pytest.mark.vllm
def test_console_lines_are_agentrls_own_with_ready_lines_eta_and_escaped_warnings(first_run):
    run = first_run
    assert run.returncode == 0, run.stdout[-2000:] + run.console[-5000:]
    lines = run.console.splitlines()
    # the commands that show the run, whole on one line (not a terminal, no COLUMNS: never wrapped)
    rd = run.run_dir
    assert f"curves: tensorboard --logdir {rd / 'tensorboard'}; report (plots, trajectories): agentrl report {rd}" in lines, lines[:10]
    # one readable line per component when it is ready, and the dtype the run chose
    assert any(re.fullmatch(r"generators ready: 1 vLLM engine on cpu, started in \d+\.\d s", line) for line in lines), lines[:40]
    assert any(re.fullmatch(r"learner ready: 1 rank on cpu \(gloo\), [\d.]+( [kMB])? parameters, full fine-tuning(, .+)?, started in "
                            r"\d+\.\d s", line) for line in lines), lines[:40]
    assert not any("{'" in line for line in lines), "a raw dict on the console"
    assert "dtype: float32 (set in the recipe)" in lines, lines[:40]
    # the supervised stage's progress lines: one per record it logged
    records = [json.loads(line) for line in run.metrics.read_text().splitlines()]
    sft_lines = [line for line in lines if re.match(rf"sft +\d+/{SFT_STEPS}  loss ", line)]
    assert len(sft_lines) == sum(r["kind"] == "sft" for r in records) >= SFT_STEPS // 25, sft_lines
    # step lines: no ETA before a step time is known, then one
    step_lines = [line for line in lines if re.match(r"step +\d+ v", line)]
    assert len(step_lines) == MAX_STEPS and "eta" not in step_lines[0], step_lines
    assert re.search(r"  t=\d+s  eta \d+(s|m\d\ds)$", step_lines[1]), step_lines  # step 2 of 3: one step left
    # every step is degenerate here (the user's env pays its bonus whatever the model says: equal
    # rewards); the warning is printed as logged, its literal brackets kept
    warnings = [r["message"] for r in records if r["kind"] == "event" and r.get("warning") and r.get("degenerate")]
    assert len(warnings) == MAX_STEPS and all("warm it up with [sft], raise rollout.group_size" in w for w in warnings), warnings
    for w in warnings:
        assert f"warning: {w}" in lines, (w, [line for line in lines if line.startswith("warning:")])
    # every console line is agentrl's own: an allowlisted format, or an event/warning it logged
    foreign = foreign_lines(run.console, run.metrics.parent)
    assert foreign == [], "\n".join(foreign[:20])


@pytest.mark.e2e
@pytest.mark.vllm
def test_own_module_default_checkpoints_rerun_and_resume_from(first_run):
    run = first_run
    proj, run_dir, recipe, sets = run.proj, run.run_dir, run.recipe, run.sets
    assert run.returncode == 0, run.stdout[-2000:] + run.console[-5000:]
    assert "kept as" not in run.console  # a new run directory: nothing set aside
    records = [json.loads(line) for line in run.metrics.read_text().splitlines()]
    # the user's environment ran in the rollout workers (its bonus 0.5 is in every reward), and so did
    # the user's reward functions, given the real episode: 0.25 + 2 * 0.125 more, no episode lost to them
    step_records = [r for r in records if r["kind"] == "step"]
    assert [r["step"] for r in step_records] == [1, 2, 3]
    assert all(r["reward_mean"] >= 1.0 and r["reward_failures_batch"] == 0 for r in step_records), step_records
    assert all(r["fn/tagged_mean"] == 0.25 and r["fn/has_answer_mean"] == 0.125 for r in step_records), step_records
    # the reruns start where the first run's RL started: its SFT model (a copy outside the run directory), no warm-up
    assert (run.sft_model / "config.json").is_file()
    sets = [*sets, "--set", "sft.steps=0", "--set", f"model.path='{run.sft_model}'"]
    second = _train(recipe, run.elsewhere, *sets)
    assert second.returncode == 0, second.stderr[-5000:]
    [old] = sorted(proj.glob("run.old-*"))
    # the first run checkpointed without a [checkpoint] section: after step 1 (checkpoint.first_step)
    assert (old / "checkpoints" / "step_000001" / "state.pkl").is_file()
    said = f"{run_dir} held a finished run: starting a new run at step 0; the finished one is kept as {old}"
    assert any(m.startswith(said) for m in _events(run_dir)), _events(run_dir)
    assert any(line.startswith(said) for line in second.stderr.splitlines())  # said on the console too, on one line
    assert (old / "summary.json").is_file() and steps(run_dir) == [1, 2, 3]

    third = _train(recipe, run.elsewhere, *sets, "--resume-from", str(old / "checkpoints" / "step_000001"))
    assert third.returncode == 0, third.stderr[-5000:]
    messages = _events(run_dir)
    assert any(m.startswith(f"--resume-from: going on from {old / 'checkpoints' / 'step_000001'} (step 1)") for m in messages), messages
    assert any(m.startswith("resuming from") for m in messages), messages
    assert steps(run_dir) == [2, 3]  # steps 2 and 3 trained again from the old run's step 1
    assert len(sorted(proj.glob("run.old-*"))) == 2  # the second run was set aside, not overwritten
