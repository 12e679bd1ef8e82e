"""A sandbox on a Docker engine: a pool of long-lived, locked-down containers, one ``exec`` per run.

See :mod:`agentrl.sandbox` for the threat model. Each container of the pool is created from a tiny
local image (:func:`ensure_image`: an empty root filesystem with ``/etc/passwd`` and the host's
top-level symlinks, imported from a tarball, so no registry is needed) with the host's ``/usr``,
the interpreter's prefix and the site-packages directories bound read-only, and runs with:

* no network (``network_mode="none"``: a loopback interface only), a private IPC namespace;
* a read-only root filesystem, a size-capped tmpfs ``/tmp``;
* a memory limit (cgroup, no swap), a CPU quota and a PID limit;
* ``cap_drop=ALL`` plus only ``CAP_SETUID``, ``CAP_SETGID`` and ``CAP_KILL``, ``no-new-privileges``;
* agentrl's seccomp profile (:func:`agentrl.sandbox._seccomp.docker_profile`): what Docker's default
  profile refuses to such a container, plus io_uring, namespaces of any kind, the new mount API,
  ``userfaultfd``, ``perf_event_open``, keyrings and foreign architectures;
* everything long-lived in it runs as uid/gid 65534 without capabilities: PID 1 is a small reaper
  that drops to 65534 at once (the container is configured as uid 0 only because Docker gives an
  ``exec -u 0`` no effective capabilities in a container configured as non-root).

An execution is one ``docker exec`` of the guest *runner* (:mod:`agentrl.sandbox.guest`) as uid 0
with those three capabilities: it reads the code from the exec's stdin, forks a child that drops to
uid 65534 and applies the rlimits, supervises it (deadline, output caps), then kills every other
process of the container, wipes ``/tmp``, ``/dev/shm``, ``/dev/mqueue`` and System V IPC objects,
and only then answers. A container runs one execution at a time. A container whose exec fails in
any way (the Docker API errors, the runner dies or answers nonsense, the run overshoots its deadline
by more than ``grace_s``) is removed and replaced; that execution raises
:class:`~agentrl.errors.SandboxError`. A session holds one container for its whole life (its
interpreter is a persistent child of a runner in session mode).

The engine must be local: containers bind host paths. ``scripts/docker.sh`` installs the Debian
``docker.io`` package, starts ``dockerd`` and builds the image (``python -m agentrl.sandbox.docker
build-image``).

This module holds what shares the container's life cycle (created, reused, wiped, removed when
broken): the container's locked-down settings, the pool, one execution's tries and the session over
one container. The image and the engine's client are :mod:`agentrl.sandbox._docker_image`, one
``docker exec`` of the runner and its connection :mod:`agentrl.sandbox._docker_exec`, the
in-container runner :mod:`agentrl.sandbox.guest.docker_runner`.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import anyio
import anyio.to_thread

from agentrl.errors import ConfigError, SandboxError, SandboxUnavailable
from agentrl.sandbox._backend import SandboxBase, SessionBase
from agentrl.sandbox._docker_exec import Container, RunnerExec
from agentrl.sandbox._docker_image import IMAGE_REPOSITORY, docker_client, ensure_image, image_tag
from agentrl.sandbox._launch import guest_argv
from agentrl.sandbox._seccomp import docker_profile
from agentrl.sandbox._layout import (
    SANDBOX_ENV,
    SANDBOX_UID,
    SYSTEM_PATHS,
    TMPFS_BYTES,
    is_within,
    resolve_python,
    site_packages_binds,
)
from agentrl.sandbox._limits import Limits
from agentrl.sandbox._process import Capture, Raw, to_result
from agentrl.sandbox.base import ExecResult

__all__ = ["DockerSandbox", "DockerSession", "IMAGE_REPOSITORY", "ensure_image", "image_tag", "remove_containers_of"]

log = logging.getLogger(__name__)

#: Label on every container this module creates (value: the creating process id).
LABEL = "agentrl.sandbox.owner"
#: Places the runner empties after every execution (as the sandbox uid).
WIPE_PATHS = ("/tmp", "/dev/shm", "/dev/mqueue")
#: Extra processes a container needs besides the code's (PID 1, the runner, its helpers).
_PID_HEADROOM = 16
#: Extra container memory besides ``memory_mb`` for PID 1 and the runner, MiB.
_MEMORY_HEADROOM_MB = 256

def remove_containers_of(pid: int) -> int:
    """Remove every sandbox container that process ``pid`` created (by the :data:`LABEL` on
    them), e.g. after that process died without closing its sandbox; how many were removed.
    Returns 0 when the engine cannot be reached (then there is nothing this can do)."""
    try:
        client = docker_client(timeout_s=30.0)
    except SandboxUnavailable:
        return 0
    removed = 0
    for container in client.containers.list(all=True, filters={"label": f"{LABEL}={pid}"}):
        try:
            container.remove(force=True)
            removed += 1
        except Exception as exc:  # already gone
            log.debug("docker sandbox: removing %s: %s", container.id[:12], exc)
    return removed


class _NotStarted(SandboxError):
    """No exec could be started in a pooled container (nothing of the code ran)."""


#: Most tries of one execution while it fails before its code started (:meth:`DockerSandbox.run`).
START_ATTEMPTS = 3


class DockerSandbox(SandboxBase):
    """Runs code in a pool of locked-down Docker containers, one ``docker exec`` per execution.

    Args:
        max_concurrency: most executions (and sessions) at once; also the most containers.
        timeout_s: default wall-clock deadline per execution, in seconds.
        memory_mb: default address space (RLIMIT_AS) each process of the code may add to the
            interpreter's when it is handed the code, in MiB (see :meth:`agentrl.sandbox.Sandbox.run`).
        max_output_bytes: how much of stdout, and of stderr, is kept per execution (bytes).
        max_processes: most processes the code may have at once (the container's PID limit
            leaves ``16`` more for the container's own processes).
        python: interpreter to run inside (its prefix is bound read-only); default: the base
            interpreter of the running Python.
        site_packages: directories bound read-only at ``/opt/site/<i>`` and put on the code's
            ``sys.path``; ``None``: the running interpreter's site-packages when ``python`` is not
            given, else none.
        cpus: CPU quota of each container (``1.0`` = one core).
        container_memory_mb: memory limit of each container (cgroup, all its processes together,
            no swap); ``None``: ``memory_mb + 256``.
        grace_s: how long past an execution's deadline the runner may take to answer before the
            container is considered broken (removed and replaced; the run raises SandboxError).

    Raises:
        SandboxUnavailable: the Docker engine is not reachable (the message says how to start it).
        SandboxError: the sandbox image could not be built.
        ConfigError: an argument is out of range.

    Use from one event loop at a time; ``await sandbox.aclose()`` (or ``async with``) removes the
    containers.
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
        site_packages: Sequence[str] | None = None,
        cpus: float = 1.0,
        container_memory_mb: int | None = None,
        grace_s: float = 15.0,
    ) -> None:
        self._init_settings(
            max_concurrency=max_concurrency, timeout_s=timeout_s, memory_mb=memory_mb,
            max_output_bytes=max_output_bytes, max_processes=max_processes,
        )
        if not cpus > 0:
            raise ConfigError(f"sandbox: cpus must be > 0, got {cpus!r}")
        if container_memory_mb is not None and not container_memory_mb > 0:
            raise ConfigError(f"sandbox: container_memory_mb must be > 0, got {container_memory_mb!r}")
        if not grace_s > 0:
            raise ConfigError(f"sandbox: grace_s must be > 0, got {grace_s!r}")
        self.cpus = float(cpus)
        self.container_memory_mb = int(container_memory_mb or memory_mb + _MEMORY_HEADROOM_MB)
        self.grace_s = float(grace_s)
        self._python, prefixes = resolve_python(python)
        self.site_packages, self._site_inside = site_packages_binds(site_packages, python)
        self._binds = self._build_binds(prefixes)
        self._client = docker_client()
        self.image = ensure_image(self._client)
        self._idle: list[Container] = []
        self._all: set[str] = set()
        #: Tries of an execution that failed before its code started and were made again in
        #: another container (the execution never saw them).
        self.start_retries = 0

    # -- public API -------------------------------------------------------------------------

    async def run(
        self, code: str, *, timeout_s: float | None = None, memory_mb: int | None = None
    ) -> ExecResult:
        """Execute ``code`` via ``docker exec`` in a pooled container; see
        :meth:`agentrl.sandbox.Sandbox.run`.

        A try that fails before the code started (:meth:`_run_once` says where that is) is made
        again in another container, at most :data:`START_ATTEMPTS` tries in all; a failure after
        it raises :class:`SandboxError`."""
        timeout, limits = self._run_limits("DockerSandbox", timeout_s, memory_mb)
        async with self._limiter.get():
            for attempt in range(START_ATTEMPTS):
                if attempt:
                    self.start_retries += 1
                try:
                    answer = await self._run_once(code, timeout, limits)
                except _NotStarted as exc:
                    if attempt == START_ATTEMPTS - 1:
                        raise SandboxError(
                            f"{exc} (tried {START_ATTEMPTS} times, never got as far as running the code)"
                        ) from exc
                    continue
                if answer[0].get("started") or answer[0].get("timed_out") or attempt == START_ATTEMPTS - 1:
                    break
        return self._result(answer, what="docker sandbox")

    async def _run_once(
        self, code: str, timeout: float, limits: Limits
    ) -> tuple[dict[str, Any], bytes, bytes]:
        """One try of an execution in a pooled container: the runner's answer.

        "Started" (see :meth:`run`) is the runner's word: its child sent ``started`` once it
        had received the request, applied the limits and dropped to the sandbox uid, right
        before it compiles and runs the code (:func:`agentrl.sandbox.guest.execution.run_one`). A
        container that cannot start an exec (it died: e.g. its init was OOM-killed) or a runner
        whose child failed before ``started`` never ran any of the code; the container is then
        removed, and :meth:`run` tries again in another.

        Raises:
            _NotStarted: no exec could be started in the container.
            SandboxError: the runner vanished or answered nonsense once it had the code.
        """
        container = await self._acquire()
        runner: RunnerExec | None = None
        started_at = time.monotonic()
        answered = False
        try:
            try:
                runner = await RunnerExec.open(self._client, container, self._runner_argv("oneshot"))
            except SandboxError as exc:
                raise _NotStarted(str(exc)) from exc
            answer = await runner.request(self._request("exec", limits, timeout), code, timeout, self.grace_s)
            answer[0]["wall_s"] = time.monotonic() - started_at  # docker exec included
            answered = True
            if not answer[0].get("started") and not answer[0].get("timed_out"):
                container.healthy = False  # its runner could not set the code up: replace it
        finally:
            if runner is not None:
                runner.close()
            if not answered:  # failed or cancelled: the runner may still be busy in there
                container.healthy = False
            with anyio.CancelScope(shield=True):
                await self._release(container)
        return answer

    async def start(self, containers: int | None = None) -> None:
        """Create containers ahead of use (default: ``max_concurrency``).

        Raises:
            SandboxError: a container could not be created.
        """
        want = self.max_concurrency if containers is None else min(containers, self.max_concurrency)
        new: list[Container] = []
        try:
            while len(self._all) < want:
                new.append(await self._create())
        finally:
            self._idle.extend(new)

    def session(self, *, memory_mb: int | None = None) -> DockerSession:
        """A notebook-like session (see :class:`agentrl.sandbox.SandboxSession`); it holds one
        container (one concurrency slot) from start to close."""
        return DockerSession(self, self._session_memory(memory_mb))

    async def aclose(self) -> None:
        """Close the sessions and remove every container; ``run`` raises afterwards."""
        await super().aclose()
        ids, self._idle = list(self._all), []
        self._all.clear()
        for cid in ids:
            await anyio.to_thread.run_sync(self._remove, cid)

    def __repr__(self) -> str:
        return (
            f"DockerSandbox(image={self.image!r}, max_concurrency={self.max_concurrency}, "
            f"timeout_s={self.timeout_s}, memory_mb={self.memory_mb}, cpus={self.cpus}, "
            f"container_memory_mb={self.container_memory_mb})"
        )

    # -- internals ---------------------------------------------------------------------------

    def _request(self, op: str, limits: Limits, timeout: float, **extra: Any) -> dict[str, Any]:
        return {
            "op": op,
            "timeout_s": timeout,
            "max_output": self.max_output_bytes,
            **limits.request_fields(),
            "nproc": 0,  # the container's PID limit counts the processes (uids are host-wide)
            **extra,
        }

    def _result(self, answer: tuple[dict[str, Any], bytes, bytes], *, what: str) -> ExecResult:
        result, out, err = answer
        if result.get("error"):
            raise SandboxError(f"{what}: {result['error']}")
        if result.get("status") is not None:
            returncode = os.waitstatus_to_exitcode(int(result["status"]))
        elif result.get("exit_code") is not None:
            returncode = int(result["exit_code"])
        else:
            returncode = -9
        out_cap, err_cap = Capture(self.max_output_bytes), Capture(self.max_output_bytes)
        out_cap.data += out
        err_cap.data += err
        err_cap.tail += err[-4096:]
        if result.get("memory_error"):
            err_cap.tail += b"\nMemoryError"
        out_cap.truncated = bool(result.get("out_truncated"))
        err_cap.truncated = bool(result.get("err_truncated"))
        raw = Raw(
            out_cap, err_cap, returncode, bool(result.get("timed_out")),
            bool(result.get("started")), float(result.get("wall_s", 0.0)),
        )
        return to_result(raw, what=what, state_lost=bool(result.get("state_lost", False)))

    async def _acquire(self) -> Container:
        while self._idle:
            container = self._idle.pop()
            if container.healthy:
                return container
            await anyio.to_thread.run_sync(self._remove, container.id)
        return await self._create()

    async def _release(self, container: Container) -> None:
        if container.healthy and not self._closed:
            self._idle.append(container)
        else:
            await anyio.to_thread.run_sync(self._remove, container.id)

    async def _create(self) -> Container:
        cid = await anyio.to_thread.run_sync(self._create_sync)
        self._all.add(cid)
        return Container(cid)

    def _create_sync(self) -> str:
        try:
            container = self._client.containers.run(
                self.image,
                command=guest_argv(self._python, "reaper", {"uid": SANDBOX_UID}),
                detach=True,
                # Started as root only so that `docker exec -u 0` gets the three capabilities
                # (Docker clears them for non-root containers); PID 1 drops to 65534 at once.
                user="0:0",
                network_mode="none",
                ipc_mode="private",
                read_only=True,
                tmpfs={"/tmp": f"rw,nosuid,nodev,size={TMPFS_BYTES},mode=1777"},
                mem_limit=f"{self.container_memory_mb}m",
                memswap_limit=f"{self.container_memory_mb}m",
                nano_cpus=int(self.cpus * 1e9),
                pids_limit=self.max_processes + _PID_HEADROOM,
                cap_drop=["ALL"],
                cap_add=["SETUID", "SETGID", "KILL"],
                security_opt=["no-new-privileges", f"seccomp={docker_profile()}"],  # Docker's default + ours
                hostname="sandbox",
                environment={"PATH": SANDBOX_ENV["PATH"]},
                volumes=self._binds,
                working_dir="/tmp",
                labels={LABEL: str(os.getpid())},
            )
        except Exception as exc:
            raise SandboxError(f"docker sandbox: cannot create a container: {exc}") from exc
        return str(container.id)

    def _remove(self, cid: str) -> None:
        self._all.discard(cid)
        try:
            self._client.api.remove_container(cid, force=True)
        except Exception as exc:  # already gone, or the engine is down: nothing more to do
            log.debug("docker sandbox: removing %s: %s", cid[:12], exc)

    def _build_binds(self, prefixes: Sequence[str]) -> dict[str, dict[str, str]]:
        binds: dict[str, dict[str, str]] = {}
        bound: list[str] = []
        for path in SYSTEM_PATHS:
            if os.path.islink(path) and os.path.dirname(path) == "/":
                continue  # recreated as a symlink in the image
            if os.path.exists(path):
                real = os.path.realpath(path)
                binds[real] = {"bind": path, "mode": "ro"}
                bound.append(real)
        for prefix in prefixes:
            if not any(is_within(prefix, b) for b in bound):
                binds[prefix] = {"bind": prefix, "mode": "ro"}
                bound.append(prefix)
        for host, inside in zip(self.site_packages, self._site_inside, strict=True):
            binds[host] = {"bind": inside, "mode": "ro"}
        return binds

    def _runner_argv(self, mode: str) -> list[str]:
        config = {
            "mode": mode,
            "uid": SANDBOX_UID,
            "env": SANDBOX_ENV,
            "wipe": list(WIPE_PATHS),
            "site": self._site_inside,
        }
        return guest_argv(self._python, "runner", config)


class DockerSession(SessionBase):
    """A session of a :class:`DockerSandbox` (see :class:`agentrl.sandbox.SandboxSession`).

    It holds one container (and one concurrency slot of the sandbox) from :meth:`start` to
    :meth:`aclose`; its interpreter is a persistent child of a runner in session mode.

    Attributes:
        restarts: how many times the interpreter was started afresh after losing its state.
    """

    _what = "docker session"

    def __init__(self, sandbox: DockerSandbox, memory_mb: int) -> None:
        super().__init__(sandbox, memory_mb)
        self._container: Container | None = None
        self._runner: RunnerExec | None = None
        self._slot: Any = None

    async def start(self) -> None:
        """Take a container and start the session's runner (``async with`` does this)."""
        sb = self.sandbox
        self._check_startable()
        if self._container is None:
            limiter = sb._limiter.get()
            await limiter.acquire_on_behalf_of(self)
            self._slot = limiter
            try:
                self._container = await sb._acquire()
            except BaseException:
                limiter.release_on_behalf_of(self)
                self._slot = None
                raise
        sb._sessions.add(self)
        if self._runner is None:
            try:
                self._runner = await RunnerExec.open(sb._client, self._container, sb._runner_argv("session"))
            except SandboxError:
                await self.aclose()
                raise

    async def run(
        self, code: str, *, timeout_s: float | None = None, memory_mb: int | None = None
    ) -> ExecResult:
        """Run one cell; see :meth:`agentrl.sandbox.SandboxSession.run`."""
        sb = self.sandbox
        timeout, limits = self._cell_limits(timeout_s, memory_mb)
        if self._runner is None:
            await self.start()
        assert self._runner is not None
        req = sb._request(
            "cell", limits, timeout, session_memory_bytes=self.memory_mb * 1024 * 1024
        )
        started_at = time.monotonic()
        try:
            answer = await self._runner.request(req, code, timeout, sb.grace_s)
            answer[0]["wall_s"] = time.monotonic() - started_at
        except SandboxError:
            await self.aclose()
            raise
        result = sb._result(answer, what="docker session")
        if result.state_lost:
            self.restarts += 1
        return result

    async def aclose(self) -> None:
        """End the interpreter, wait for the runner's clean-up, and give the container back
        (a container that did not clean up in time is removed instead)."""
        self._closed = True
        sb = self.sandbox
        sb._sessions.discard(self)
        runner, self._runner = self._runner, None
        container, self._container = self._container, None
        if runner is not None:
            with anyio.CancelScope(shield=True):
                clean = await runner.finish()
            runner.close()
            if container is not None and not clean:
                container.healthy = False
        if container is not None:
            with anyio.CancelScope(shield=True):
                await sb._release(container)
        if self._slot is not None:
            self._slot.release_on_behalf_of(self)
            self._slot = None


def _main(argv: Sequence[str]) -> int:
    """``python -m agentrl.sandbox.docker build-image``: build the image if missing, print it."""
    if list(argv) != ["build-image"]:
        print("usage: python -m agentrl.sandbox.docker build-image", file=sys.stderr)
        return 2
    started = time.monotonic()
    try:
        tag = ensure_image()
    except SandboxError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{tag} ({time.monotonic() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
