"""Ray at the edge: an actor's output redirected to its log file."""

from __future__ import annotations

import os
import subprocess
import sys

from agentrl.engine.common.cluster import ACTOR_LOG_ENV


def test_redirect_actor_output_sends_the_process_and_its_children_to_the_file(tmp_path):
    log = tmp_path / "logs" / "generator-0.log"
    code = (
        "import os, subprocess, sys\n"
        "from agentrl.engine.common.cluster import redirect_actor_output\n"
        "redirect_actor_output()\n"
        "print('from python'); sys.stderr.write('to stderr\\n'); sys.stdout.flush()\n"
        "subprocess.run(['sh', '-c', 'echo from a child process'])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, ACTOR_LOG_ENV: str(log)})
    assert out.returncode == 0, out.stderr
    assert out.stdout == "" and out.stderr == ""
    assert log.read_text().splitlines() == ["from python", "to stderr", "from a child process"]
    # without the variable nothing changes
    plain = subprocess.run([sys.executable, "-c", "from agentrl.engine.common.cluster import redirect_actor_output as r; r(); print('here')"],
                           capture_output=True, text=True, timeout=60, env={k: v for k, v in os.environ.items() if k != ACTOR_LOG_ENV})
    assert plain.stdout == "here\n"


def test_the_setup_hook_pins_every_thread_and_the_children_to_the_actors_cores():
    """``cpu_affinity`` of an actor: its process (threads started before the hook included) and the
    processes it starts (vLLM's engine, sandboxes) run on those cores only."""
    from agentrl.engine.common.cluster import ACTOR_CPUS_ENV

    code = (
        "import os, subprocess, sys, threading, time\n"
        "early = threading.Thread(target=time.sleep, args=(1,)); early.start()\n"
        "from agentrl.engine.common.cluster import redirect_actor_output\n"
        "redirect_actor_output()\n"
        "print(sorted(os.sched_getaffinity(0)), sorted(os.sched_getaffinity(early.native_id)))\n"
        "sys.stdout.flush()\n"
        "subprocess.run([sys.executable, '-c', 'import os; print(sorted(os.sched_getaffinity(0)))'])\n"
        "early.join()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, ACTOR_CPUS_ENV: "1"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["[1] [1]", "[1]"]
    # started on core 0 only (as Ray's processes are when the controller runs under taskset): the
    # actor's own cores still win
    moved = subprocess.run(["taskset", "-c", "0", sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=60, env={**os.environ, ACTOR_CPUS_ENV: "1"})
    assert moved.stdout.splitlines() == ["[1] [1]", "[1]"], moved.stderr
    # a core this machine does not have: a warning, and nothing pinned
    none = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, ACTOR_CPUS_ENV: "4096"})
    everything = sorted(os.sched_getaffinity(0))
    assert none.stdout.splitlines()[0] == f"{everything} {everything}" and "not pinned" in none.stderr


def test_actor_runtime_env_carries_the_cores():
    from agentrl.engine.common.cluster import ACTOR_CPUS_ENV
    from agentrl.engine.wiring import actor_runtime_env

    assert actor_runtime_env(__import__("pathlib").Path("/tmp"), "generator-0", [0, 2])["env_vars"][ACTOR_CPUS_ENV] == "0,2"
    assert ACTOR_CPUS_ENV not in actor_runtime_env(__import__("pathlib").Path("/tmp"), "learner-0")["env_vars"]
