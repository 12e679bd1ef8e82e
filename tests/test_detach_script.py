"""scripts/detach.sh: a daemon a script starts keeps none of the caller's open files."""

import os
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_a_detached_daemon_holds_no_file_of_the_shell_that_started_it(tmp_path: Path) -> None:
    lock, log, pid_file = tmp_path / "held.lock", tmp_path / "daemon.log", tmp_path / "pid"
    # the shell holds a lock file open on fd 7 (as `flock` or a CI runner's pipe would), then starts
    # a stand-in daemon that writes its pid and sleeps
    script = (f"exec 7>{lock}; source scripts/detach.sh; "
              f"start_detached {log} bash -c 'echo $$ > {pid_file}; echo started; exec sleep 30'")
    subprocess.run(["bash", "-c", script], cwd=REPO, check=True, timeout=30)
    deadline = time.monotonic() + 10
    while not (pid_file.is_file() and pid_file.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    pid = int(pid_file.read_text())
    try:
        fds = {int(fd): os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        assert str(lock) not in fds.values(), fds
        assert sorted(fds) == [0, 1, 2] and fds[0] == "/dev/null" and fds[1] == str(log) == fds[2]
        assert os.getsid(pid) == pid  # a session of its own
        assert log.read_text() == "started\n"
    finally:
        os.kill(pid, 9)
