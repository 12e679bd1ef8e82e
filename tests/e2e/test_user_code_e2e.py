"""The user's own modules on a real two-node Ray cluster (issue 36): the second node, started in
another directory, builds the user's module:Class env from the module the run ships (e2e tier:
two `ray start`s take most of a minute)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_user_code import _project

def _kill_cluster(temp: Path) -> None:
    """Kill, by pid, the processes of the test cluster whose temp dir is ``temp`` (it is in their
    command lines), never a Ray instance of anything else on the machine."""
    import signal

    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if str(temp) in (proc / "cmdline").read_bytes().decode(errors="replace"):
                os.kill(int(proc.name), signal.SIGKILL)
        except (OSError, ProcessLookupError):
            continue


@pytest.mark.ray
def test_a_second_node_started_elsewhere_builds_the_users_env_from_the_shipped_module(tmp_path):
    """Two Ray nodes on this machine, the second started in another directory; the driver loads
    a recipe whose environment module lies beside it, joins the cluster with the run's job
    runtime_env, deletes the module's folder, and a task on the second node builds the env."""
    import shutil
    import tempfile

    from tests.e2e.helpers import free_port

    ray_cli = str(Path(sys.executable).parent / "ray")
    port = free_port()
    address = f"127.0.0.1:{port}"
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    environ.update(RAY_AUTH_MODE="disabled")
    temp = Path(tempfile.mkdtemp(prefix="agrl", dir="/tmp"))  # Ray's socket paths must stay < 108 bytes
    dirs = {name: tmp_path / name for name in ("head", "second", "driver")}
    for d in dirs.values():
        d.mkdir()
    recipe = _project(tmp_path / "proj")
    driver = dirs["driver"] / "driver.py"
    driver.write_text(f'''
import shutil
import agentrl, ray
from agentrl.engine import wiring
recipe = agentrl.load({str(recipe)!r}, ray={{"address": {address!r}}})
kwargs = wiring.ray_init_kwargs(recipe)
ray.init(address=kwargs["address"], runtime_env=kwargs["runtime_env"], logging_level="error")
shutil.rmtree({str(tmp_path / "proj")!r})

@ray.remote(num_cpus=0, resources={{"second_node": 1}})
def build():
    from agentrl.envs import make_env
    import my_envs
    env = make_env("my_envs:EchoEnv", bonus=0.5)
    return ray.get_runtime_context().get_node_id(), my_envs.__file__, type(env).__name__, env.bonus

node, file, name, bonus = ray.get(build.remote(), timeout=180)
second = [n["NodeID"] for n in ray.nodes() if n["Alive"] and "second_node" in n["Resources"]]
print("RESULT", node in second, file, name, bonus)
ray.shutdown()
''')
    try:
        subprocess.run([ray_cli, "start", "--head", f"--port={port}", "--num-cpus=1", "--include-dashboard=false", f"--temp-dir={temp}"],
                       check=True, capture_output=True, timeout=120, env=environ, cwd=dirs["head"])
        subprocess.run([ray_cli, "start", f"--address={address}", "--num-cpus=1", '--resources={"second_node": 1}'],
                       check=True, capture_output=True, timeout=120, env=environ, cwd=dirs["second"])
        done = subprocess.run([sys.executable, str(driver)], cwd=dirs["driver"], env=environ, capture_output=True, text=True, timeout=300)
    finally:
        _kill_cluster(temp)
        shutil.rmtree(temp, ignore_errors=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    [line] = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    on_second, file, name, bonus = line.split()[1:]
    assert on_second == "True" and name == "EchoEnv" and bonus == "0.5", line
    assert str(tmp_path / "proj") not in file  # Ray's shipped copy, not the (deleted) original
