"""UNSAFE: runs model-written code as a plain subprocess of this host. For debugging only.

:class:`UnsafeLocalSandbox` has the same contract as :class:`~agentrl.sandbox.BubblewrapSandbox`
(isolated interpreter, clean environment, the same rlimits, a fresh temporary working directory,
the process group killed at the deadline) but **no isolation**: the code runs as the calling user,
sees and can modify every file that user can (including the repository and credentials), can use
the network, can see and signal other processes, and can escape the deadline by leaving its process
group (``os.setsid``) or daemonizing. Under root, ``RLIMIT_NPROC`` is not enforced by the kernel.
Never point it at code you would not run by hand.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import tempfile

from agentrl.errors import SandboxError
from agentrl.sandbox._backend import SandboxBase, TreeSession
from agentrl.sandbox._launch import guest_argv, oneshot_argv
from agentrl.sandbox._layout import base_python
from agentrl.sandbox._process import run_process, to_result
from agentrl.sandbox._tree import AsyncConn, Tree
from agentrl.sandbox.base import ExecResult

__all__ = ["UnsafeLocalSandbox", "UnsafeLocalSession"]

log = logging.getLogger(__name__)


class UnsafeLocalSandbox(SandboxBase):
    """UNSAFE: runs code in a plain local subprocess (``python -I``), with rlimits but no isolation.

    Same arguments and results as :class:`~agentrl.sandbox.BubblewrapSandbox`. Each execution gets
    a fresh temporary directory as working directory, ``HOME`` and ``TMPDIR``, a clean environment
    (``PATH``, ``HOME``, ``TMPDIR``, ``LANG``, ``PYTHONDONTWRITEBYTECODE``), its own session and
    process group (killed at the deadline and after the code exits). It logs a warning when
    constructed. Use it only to debug on machines without bubblewrap.

    Args:
        max_concurrency: most executions running at once.
        timeout_s: default wall-clock deadline per execution, in seconds.
        memory_mb: default address space (RLIMIT_AS) each process may add to the interpreter's
            when it is handed the code, in MiB (see :meth:`agentrl.sandbox.Sandbox.run`).
        max_output_bytes: how much of stdout, and of stderr, is kept per execution (bytes).
        max_processes: RLIMIT_NPROC (counted over *all* processes of the calling user; not
            enforced for root).
        python: interpreter to run (path or name on PATH); default: the base interpreter of the
            running Python.
    """

    def __init__(
        self,
        *,
        max_concurrency: int = 4,
        timeout_s: float = 10.0,
        memory_mb: int = 512,
        max_output_bytes: int = 16384,
        max_processes: int = 64,
        python: str | None = None,
    ) -> None:
        self._init_settings(
            max_concurrency=max_concurrency, timeout_s=timeout_s, memory_mb=memory_mb,
            max_output_bytes=max_output_bytes, max_processes=max_processes,
        )
        if python is None:
            self._python = base_python()
        else:
            found = shutil.which(python)
            if found is None:
                raise SandboxError(f"unsafe-local sandbox: python interpreter {python!r} not found")
            self._python = found
        log.warning(
            "UnsafeLocalSandbox: model-written code will run UNSANDBOXED on this host as uid %d "
            "(files, network and processes are all reachable). Use only for debugging; use "
            "the 'bubblewrap' sandbox for anything else.",
            os.geteuid(),
        )

    async def run(
        self, code: str, *, timeout_s: float | None = None, memory_mb: int | None = None
    ) -> ExecResult:
        """Execute ``code`` in a local subprocess; see :meth:`agentrl.sandbox.Sandbox.run`."""
        timeout, limits = self._run_limits("UnsafeLocalSandbox", timeout_s, memory_mb)
        async with self._limiter.get():
            with tempfile.TemporaryDirectory(prefix="agentrl-sandbox-") as workdir:
                raw = await run_process(
                    lambda marker_fd: oneshot_argv(self._python, marker_fd, limits),
                    code=code,
                    env=_local_env(workdir),
                    cwd=workdir,
                    timeout_s=timeout,
                    max_output_bytes=self.max_output_bytes,
                )
        return to_result(raw, what="unsafe-local sandbox")

    def session(self, *, memory_mb: int | None = None) -> UnsafeLocalSession:
        """A notebook-like session (see :class:`agentrl.sandbox.SandboxSession`), just as unsafe:
        one local interpreter process in a temporary directory, in a session of its own."""
        return UnsafeLocalSession(self, self._session_memory(memory_mb))

    def __repr__(self) -> str:
        return (
            f"UnsafeLocalSandbox(python={self._python!r}, max_concurrency={self.max_concurrency}, "
            f"timeout_s={self.timeout_s}, memory_mb={self.memory_mb})"
        )


def _local_env(workdir: str) -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": workdir,
        "TMPDIR": workdir,
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
    }


class UnsafeLocalSession(TreeSession):
    """UNSAFE: a session of an :class:`UnsafeLocalSandbox` (see
    :class:`agentrl.sandbox.SandboxSession`).

    One local ``python -I -S`` process (its own process group and session, a fresh temporary
    working directory) keeps the state; at a cell's deadline its group is killed and the state is
    lost. Processes a cell leaves behind are killed when it ends, unless they escaped by changing
    their parent (daemons): there is no isolation.

    Attributes:
        restarts: how many times the interpreter was started afresh after losing its state.
    """

    _what = "unsafe-local session"

    def __init__(self, sandbox: UnsafeLocalSandbox, memory_mb: int) -> None:
        super().__init__(sandbox, memory_mb)
        self._workdir: str | None = None

    async def _new_tree(self) -> Tree:
        if self._workdir is None:
            self._workdir = tempfile.mkdtemp(prefix="agentrl-session-")
        host_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        config = {"fd": child_end.fileno(), "env": _local_env(self._workdir), "cwd": self._workdir}
        try:
            proc = subprocess.Popen(
                guest_argv(self.sandbox._python, "session", config),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                env=_local_env(self._workdir), cwd=self._workdir, pass_fds=(child_end.fileno(),),
                start_new_session=True,
            )
        except OSError as exc:
            host_end.close()
            raise SandboxError(f"unsafe-local session: cannot start the interpreter: {exc}") from exc
        finally:
            child_end.close()
        return Tree(AsyncConn(host_end), proc=proc)

    async def aclose(self) -> None:
        """Kill the interpreter's process group and remove its working directory."""
        await super().aclose()

    def _free(self) -> None:
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None
