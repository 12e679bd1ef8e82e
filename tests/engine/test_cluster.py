"""Ray at the edge: an actor's output redirected to its log file."""

from __future__ import annotations

import os
import subprocess
import sys

from agentrl.engine.cluster import ACTOR_LOG_ENV


def test_redirect_actor_output_sends_the_process_and_its_children_to_the_file(tmp_path):
    log = tmp_path / "logs" / "generator-0.log"
    code = (
        "import os, subprocess, sys\n"
        "from agentrl.engine.cluster import redirect_actor_output\n"
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
    plain = subprocess.run([sys.executable, "-c", "from agentrl.engine.cluster import redirect_actor_output as r; r(); print('here')"],
                           capture_output=True, text=True, timeout=60, env={k: v for k, v in os.environ.items() if k != ACTOR_LOG_ENV})
    assert plain.stdout == "here\n"
