"""Learning, end to end, on a two-node Ray cluster: a real `agentrl train` run moves the policy in
the rewarded direction, with its generator and learner placed on the second node.

The task rewards an answer whose first character is a digit. What RL should change is then one
number that needs no sampling to measure: the probability the policy gives, at the first
generated position, to tokens that start with a digit, averaged over held-out prompts, computed
exactly from the weights before and after the run. It can only rise well beyond noise if the
advantages reach the generated tokens with the right sign (a flipped sign lowers it, a lost
advantage leaves it where it was); the run is async with max_staleness 1, so tokens from stale
versions are in the loss.

The cluster: two Ray nodes on one machine (`ray start --head`, `ray start --address`); the
generator and the learner are placed by a custom resource on the second node, which was started
from another directory, and the run completes against the cluster with a relative run directory,
which the learner on the other node writes into. (One run covers both, formerly this test and
test_cluster_e2e.py's: one start-up.)
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from agentrl.engine.episodes.render import IncrementalRenderer
from agentrl.envs.data import load_rows
from tests.e2e.direction_env import rewarded
from tests.e2e.helpers import REPO, free_port, train_cmd

STEPS = 12
RAY = str(Path(sys.executable).parent / "ray")


def _rewarded_mass(model_dir, questions: list[str]) -> float:
    """Mean over ``questions`` of the probability of a rewarded first token."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    good = torch.tensor([rewarded(tok.decode([i])) for i in range(len(tok))] + [False] * (model.config.vocab_size - len(tok)))
    assert 0 < good.sum() < len(good)
    masses = []
    with torch.no_grad():
        for q in questions:
            ids = IncrementalRenderer(tok, [{"role": "user", "content": q}]).prompt_ids()  # as the rollout renders it
            probs = model(torch.tensor([ids])).logits[0, -1].softmax(-1)
            masses.append(float(probs[good].sum()))
    return sum(masses) / len(masses)


def _ray_start(args: list[str], *, env: dict[str, str], cwd: Path | None = None) -> None:
    """`ray start ARGS`; a node that does not start fails the test with what Ray printed."""
    proc = subprocess.run([RAY, "start", *args], capture_output=True, text=True, timeout=120, env=env, cwd=cwd)
    assert proc.returncode == 0, f"`ray start {' '.join(args)}` exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"


@pytest.mark.e2e
@pytest.mark.vllm
def test_rl_on_a_two_node_cluster_moves_the_policy_toward_the_reward(tmp_path, tiny_calc_model):
    port = free_port()
    address = f"127.0.0.1:{port}"
    # a local test cluster without Ray's token authentication (real clusters keep it: the token
    # in ~/.ray/auth_token reaches `agentrl train` the same way it reaches `ray start`);
    # PYTHONPATH: every node's workers import the task, tests.e2e.direction_env
    env = {**os.environ, "RAY_DEDUP_LOGS": "0", "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(REPO)}
    temp = Path(tempfile.mkdtemp(prefix="agrl", dir="/tmp"))  # Ray's socket paths must stay < 108 bytes
    head = ["--head", f"--port={port}", "--num-cpus=3", "--include-dashboard=false", f"--temp-dir={temp}"]
    _ray_start(head, env=env)
    try:
        elsewhere = tmp_path / "elsewhere"  # the second node's processes start here, not where the driver runs
        elsewhere.mkdir()
        _ray_start([f"--address={address}", "--num-cpus=2", '--resources={"gen_node": 2}'], env=env, cwd=elsewhere)
        driver_dir = tmp_path / "driver"
        driver_dir.mkdir()
        cmd = train_cmd(
            "run", tiny_calc_model,  # relative: the run directory is resolved once, on the driver
            f"ray.address='{address}'",
            "generator.resources={gen_node = 1}",
            "learner.resources={gen_node = 1}",
            "checkpoint.every_steps=4",
            "env.id='tests.e2e.direction_env:DigitFirstEnv'",
            "env.kwargs={}",
            "sft.steps=0",
            "eval.limit=0",
            f"learner.max_steps={STEPS}",
            "learner.batch_size=32",
            "learner.lr=3e-3",
            "rollout.group_size=8",
            "rollout.max_new_tokens=2",
            "data.limit=256",
        )
        proc = subprocess.run(cmd, cwd=driver_dir, capture_output=True, text=True, timeout=900, env=env)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
        run_dir = driver_dir / "run"
        assert (run_dir / "final" / "model.safetensors").is_file()  # written by the learner on the other node
        assert (run_dir / "checkpoints" / "step_000004" / "weights" / "model.safetensors").is_file()
        assert not (elsewhere / "run").exists()
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        gen_nodes = [g["node_id"] for e in records if "generators" in e for g in e["generators"]]
        learner_nodes = [lr["node_id"] for e in records if "learners" in e for lr in e["learners"]]
        assert gen_nodes and learner_nodes, "the run did not report where its generator and learner ran"

        import ray

        os.environ["RAY_AUTH_MODE"] = "disabled"
        ray.init(address=address, logging_level="error")
        try:
            second = [n["NodeID"] for n in ray.nodes() if n["Alive"] and "gen_node" in n["Resources"]]
        finally:
            ray.shutdown()
        assert gen_nodes == second and learner_nodes == second
    finally:
        # stop only this cluster's processes (its temp dir is in their command lines), never a
        # Ray instance of anything else on the machine
        subprocess.run(["pkill", "-9", "-f", str(temp)], capture_output=True, timeout=60)
        shutil.rmtree(temp, ignore_errors=True)

    assert [r["step"] for r in records if r["kind"] == "step"] == list(range(1, STEPS + 1))
    held_out = [row["question"] for row in load_rows("synthetic:calc", limit=1024)[-64:]]
    before = _rewarded_mass(tiny_calc_model, held_out)
    after = _rewarded_mass(run_dir / "final", held_out)
    rewards = [r["reward_mean"] for r in records if r["kind"] == "step"]
    print(f"rewarded first-token mass {before:.3f} -> {after:.3f}; reward per step {rewards}")
    assert len(rewards) == STEPS
    assert after > before + 0.15 and after > 4 * before, (before, after, rewards)
