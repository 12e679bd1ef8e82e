"""PPO with a learned critic and an LLM judge for real: Ray, vLLM (CPU), the learner's and the
critic's FSDP2 ranks (gloo), bubblewrap. ``recipes/tiny_calc_judge.toml``: the policy's vLLM
generator judges its own training episodes (structured output "Score: N"), the reward is
1.0 * env + 0.1 * judge; checkpoints hold the critic and a resume puts it back; in the resumed
run the critic rank's process is killed with SIGKILL (issue 37), and the critic restarts with the
learner from the newest checkpoint in the same process. (One run covers all three, to spend one
engine start-up.)

The judge and the critic are checked by what they did, not by the run's own averages: the judge's
score of every decoded episode in ``samples.jsonl`` is recovered from its reward and its text (the
environment's reward recomputed from the text), and must be one of the scores the judge can give
and not always the same; the critic's prediction error on fresh batches must fall."""

import json
import os
import re
import signal
import subprocess
import tomllib

import pytest

from agentrl.cli import train_command
from agentrl.engine.common.audit import episodes_audit_path, read_audit
from agentrl.envs.calc import as_int
from agentrl.envs.parsers import extract_boxed
from tests.e2e.helpers import REPO, actor_pids, kill_tree, placements
from tests.e2e.test_failover_e2e import _wait
from tests.e2e.test_train_e2e import SMALL_RUN

RECIPE = REPO / "recipes" / "tiny_calc_judge.toml"
PPO = (
    'algo.advantage="gae"', "critic.warmup_steps=1", "critic.lr=1e-3", "checkpoint.every_steps=2",
    # the untrained model judges greedily with one score for every episode; sampled, its scores
    # differ, so that a judge whose score never reaches the reward cannot pass for one
    "reward.judge.temperature=1.0",
    *SMALL_RUN,
)


def judged_ppo(run_dir, model, *overrides):
    return train_command(str(RECIPE), str(run_dir), str(model), *overrides, *PPO)


def resumed_steps(run_dir) -> int:
    """The newest step the resumed run logged (0 before its resume event: until then the file
    still holds the first run's steps)."""
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written
            continue
    resumed = [i for i, r in enumerate(records) if r["kind"] == "event" and r["message"].startswith("resuming from")]
    return max((r["version"] for r in records[resumed[-1]:] if r["kind"] == "step"), default=0) if resumed else 0


def steps_of(run_dir):
    return [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "step"]


def env_reward(text: str) -> float:
    """Calc-v0's reward recomputed from a decoded episode: 1.0 when the last ``\\boxed{}`` of the
    model's last turn is ``a*b+c`` of the question, else 0.0."""
    a, b, c = map(int, re.search(r"Compute (\d+)\*(\d+)\+(\d+)\.", text).groups())
    last_turn = text.rsplit("<|im_start|>assistant", 1)[1].split("<|im_end|>", 1)[0]
    if "<code>" in last_turn:  # a tool call, not a final answer
        return 0.0
    boxed = extract_boxed(last_turn)
    return 1.0 if boxed is not None and as_int(boxed) == a * b + c else 0.0


def judge_score(reward: float, env: float, env_weight: float, weight: float, levels: int) -> int:
    """The judge's raw score (0..levels) that makes ``reward = env_weight * env + weight * score / levels``;
    fails when none does."""
    raw = (reward - env_weight * env) / weight * levels
    score = round(raw)
    assert 0 <= score <= levels and raw == pytest.approx(score, abs=1e-4), (reward, env, raw)
    return score


@pytest.mark.e2e
@pytest.mark.vllm
def test_ppo_with_a_critic_and_a_policy_judge_trains_checkpoints_and_resumes(tmp_path, tiny_calc_model):
    reward = tomllib.loads(RECIPE.read_text())["reward"]
    env_weight, weight = reward["env_weight"], reward["judge"]["weight"]
    levels = reward["judge"]["score_max"] - reward["judge"]["score_min"]
    run_dir = tmp_path / "run"
    first = subprocess.run(judged_ppo(run_dir, tiny_calc_model, "learner.max_steps=3"), cwd=REPO,
                           capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    steps = steps_of(run_dir)
    assert [s["version"] for s in steps] == [1, 2, 3]
    # warm-up: the first step trains the critic alone, the policy's version still advances
    assert steps[0].get("policy_held") == 1.0 and steps[0]["trained_tokens"] == 0.0
    assert all("policy_held" not in s and s["trained_tokens"] > 0 for s in steps[1:])
    assert all(s["reward_failures_batch"] == 0 for s in steps)  # the constrained answer always parses
    assert placements(run_dir) == ["colocated"]  # the critic in the mode "auto" picks on a CPU: it and the learner share the cores
    ckpt = run_dir / "checkpoints" / "step_000002"
    assert json.loads((ckpt / "critic" / "trainer_state.json").read_text())["step"] == 2

    # further, from checkpoint 2 (the run finished: the same command alone would start a new one),
    # with the critic's state (its step counter goes on); once step 3 is logged the critic rank's
    # process is SIGKILLed: the critic and the learner restart from checkpoint 2 in the run, said in
    # one line, and the run completes
    log_path = tmp_path / "second.log"
    with open(log_path, "w") as log:
        second = subprocess.Popen([*judged_ppo(run_dir, tiny_calc_model, "learner.max_steps=5"), "--resume-from", str(ckpt)], cwd=REPO,
                                  stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        _wait(second, log_path, lambda: resumed_steps(run_dir) >= 3, "step 3 of the resumed run")
        critic_pids = actor_pids(run_dir, "critic-0")
        assert len(critic_pids) == 1, critic_pids
        os.kill(critic_pids[0], signal.SIGKILL)
        rc = second.wait(timeout=900)
    finally:
        if second.poll() is None:
            kill_tree(second)
    output = log_path.read_text()
    assert rc == 0, output[-5000:]
    assert "Traceback" not in output, output[-5000:]
    restarts = [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r.get("critic_restarts")]
    assert len(restarts) == 1 and restarts[0]["message"].startswith("critic rank 0 died"), restarts
    assert "restarting the learner and the critic from checkpoint step_" in restarts[0]["message"]
    assert sum("critic rank 0 died" in line for line in output.splitlines()) == 1, output[-5000:]  # one console line
    assert "resuming from" in output and "held a finished run" not in output, output[-5000:]
    steps = steps_of(run_dir)
    assert [s["version"] for s in steps] == [1, 2, 3, 4, 5]
    assert json.loads((run_dir / "checkpoints" / "step_000004" / "critic" / "trainer_state.json").read_text())["step"] == 4

    # the judge, episode by episode: each decoded episode's reward is the environment's reward
    # (recomputed from its text) plus the weight times a score the judge can give
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    judged = [s for s in samples if s["status"] != "infra_failure"]
    assert len(judged) >= 8, samples
    scores = [judge_score(s["reward"], env_reward(s["text"]), env_weight, weight, levels) for s in judged]
    # ... and of every episode the rollout workers finished (their append-only record; the
    # judge's share of a reward is below the environment's reward step of 1, so it is recovered)
    episodes = [e for e in read_audit(episodes_audit_path(run_dir)) if e["status"] != "infra_failure"]
    all_scores = [judge_score(e["reward"], float(e["reward"] >= env_weight), env_weight, weight, levels) for e in episodes]
    print(f"judge scores: decoded episodes {scores}; all episodes {sorted(all_scores)}")
    assert len(set(all_scores)) >= 2, f"the judge gave every episode the same score: {all_scores}"

    # the critic learns: at step 1 (the warm-up) the zero-initialised value head predicts 0; after
    # it, on each fresh batch (before that batch's update), the critic's mean value is nearer the
    # batch's mean return than the untrained head's 0 would be on the same batches. (Same-batch:
    # the returns vary with the sampled judge from batch to batch far more than the critic's
    # error, so comparing early and late batches' errors would be noise.)
    gap = [abs(s["value_mean"] - s["return_mean"]) for s in steps]
    untrained = [abs(s["return_mean"]) for s in steps]
    print(f"value_mse per step {[s['value_mse'] for s in steps]}; |value_mean - return_mean| per step {gap}; "
          f"|return_mean| per step {untrained}")
    assert all(s["value_tokens"] > 0 and "value_explained_variance" in s for s in steps)
    assert steps[0]["value_mean"] == 0.0 and gap[0] > 0, steps[0]
    assert sum(gap[1:]) < sum(untrained[1:]), (gap, untrained)
