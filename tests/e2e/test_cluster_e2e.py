"""Two Ray nodes on one machine (`ray start --head`, `ray start --address`): the generator and
the learner are placed by a custom resource on the second node, which was started from another
directory, and the run completes against the cluster with a relative run directory."""

import json
import os
import socket
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.e2e.helpers import train_cmd

RAY = str(Path(sys.executable).parent / "ray")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.e2e
@pytest.mark.vllm
def test_generator_and_learner_run_on_second_node(tmp_path, tiny_calc_model):
    port = _port()
    address = f"127.0.0.1:{port}"
    # a local test cluster without Ray's token authentication (real clusters keep it: the token
    # in ~/.ray/auth_token reaches `agentrl train` the same way it reaches `ray start`)
    env = {**os.environ, "RAY_DEDUP_LOGS": "0", "RAY_AUTH_MODE": "disabled"}
    temp = Path(tempfile.mkdtemp(prefix="agrl", dir="/tmp"))  # Ray's socket paths must stay < 108 bytes
    head = ["--head", f"--port={port}", "--num-cpus=3", "--include-dashboard=false", f"--temp-dir={temp}"]
    subprocess.run([RAY, "start", *head], check=True, capture_output=True, timeout=120, env=env)
    try:
        elsewhere = tmp_path / "elsewhere"  # the second node's processes start here, not where the driver runs
        elsewhere.mkdir()
        subprocess.run(
            [RAY, "start", f"--address={address}", "--num-cpus=2", '--resources={"gen_node": 2}'],
            check=True, capture_output=True, timeout=120, env=env, cwd=elsewhere,
        )
        driver_dir = tmp_path / "driver"
        driver_dir.mkdir()
        cmd = train_cmd(
            "run", tiny_calc_model,  # relative: the run directory is resolved once, on the driver
            f"ray.address='{address}'",
            "generator.resources={gen_node = 1}",
            "learner.resources={gen_node = 1}",
            "checkpoint.every_steps=1",
            "sft.steps=0",
            "eval.limit=0",
            "learner.max_steps=2",
            "learner.batch_size=8",
            "rollout.max_new_tokens=16",
        )
        proc = subprocess.run(cmd, cwd=driver_dir, capture_output=True, text=True, timeout=900, env=env)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-5000:]
        run_dir = driver_dir / "run"
        assert (run_dir / "final" / "model.safetensors").is_file()  # written by the learner on the other node
        assert (run_dir / "checkpoints" / "step_000001" / "weights" / "model.safetensors").is_file()
        assert not (elsewhere / "run").exists()
        events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        gen_nodes = [g["node_id"] for e in events if "generators" in e for g in e["generators"]]
        learner_nodes = [lr["node_id"] for e in events if "learners" in e for lr in e["learners"]]
        assert gen_nodes and learner_nodes, "the run did not report where its generator and learner ran"

        import ray

        os.environ["RAY_AUTH_MODE"] = "disabled"
        ray.init(address=address, logging_level="error")
        try:
            second = [n["NodeID"] for n in ray.nodes() if n["Alive"] and "gen_node" in n["Resources"]]
        finally:
            ray.shutdown()
        assert gen_nodes == second and learner_nodes == second
        assert [e["step"] for e in events if e["kind"] == "step"] == [1, 2]
    finally:
        # stop only this cluster's processes (its temp dir is in their command lines), never a
        # Ray instance of anything else on the machine
        subprocess.run(["pkill", "-9", "-f", str(temp)], capture_output=True, timeout=60)
        shutil.rmtree(temp, ignore_errors=True)
