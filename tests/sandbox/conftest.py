"""Shared fixtures of the sandbox tests: one sandbox per backend for the whole session.

Backends: ``bubblewrap-exec`` (one bwrap container per execution), ``bubblewrap-warm`` (warm
fork-server workers, started before the tests so that they really serve the executions),
``docker`` (the Docker engine is made available with ``scripts/docker.sh`` when it does not answer:
these tests run, they never skip) and ``unsafe-local``.

Every test here that needs the Docker engine carries the ``docker`` marker (``-m "not docker"``
leaves them out): those run on the ``docker`` backend (a parameter whose value is ``"docker"``),
those that request ``docker_engine``, and those of ``test_docker.py`` but the few listed in
:data:`NO_ENGINE`. A marked test gets the engine started before it runs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import anyio
import pytest

from agentrl.sandbox import (
    BubblewrapSandbox,
    ExecResult,
    SessionSandbox,
    UnsafeLocalSandbox,
)
from tests.conftest import require_mark

REPO = Path(__file__).resolve().parents[2]
T = TypeVar("T")

#: Every backend, and the ones that isolate (the unsafe local one does not).
BACKENDS = ["bubblewrap-exec", "bubblewrap-warm", "docker", "unsafe-local"]
ISOLATED = ["bubblewrap-exec", "bubblewrap-warm", "docker"]
#: Settings shared by every backend fixture.
SETTINGS: dict[str, Any] = {
    "max_concurrency": 2,
    "timeout_s": 5.0,
    "memory_mb": 256,
    "max_output_bytes": 4096,
    "max_processes": 32,
}


def arun(fn: Callable[[], Awaitable[T]], backend: str = "asyncio") -> T:
    return anyio.run(fn, backend=backend)


def run(sb: Any, code: str, backend: str = "asyncio", **kwargs: Any) -> ExecResult:
    async def go() -> ExecResult:
        return await sb.run(code, **kwargs)

    return arun(go, backend)


def comm_code(token: str) -> str:
    """Code that names the current process ``token`` (its ``comm``, inherited by forks), so that
    the host can find every process the code starts, whatever namespace it is in."""
    return f"import ctypes\nctypes.CDLL(None).prctl(15, {token[:15].encode()!r}, 0, 0, 0)\n"  # PR_SET_NAME


def processes_named(token: str) -> list[int]:
    """Host pids whose ``comm`` is ``token`` (15 characters at most)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/comm") as f:
                    if f.read().strip() == token[:15]:
                        found.append(int(name))
            except OSError:
                continue
    return found


def wait_none_named(token: str, within_s: float = 3.0) -> list[int]:
    deadline = time.monotonic() + within_s
    while (left := processes_named(token)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


#: Tests of ``test_docker.py`` that do not need the engine (they point the client elsewhere).
NO_ENGINE = {"test_unreachable_engine_is_unavailable"}


def _needs_docker(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "docker" in callspec.params.values():
        return True
    if "docker_engine" in getattr(item, "fixturenames", ()):
        return True
    return item.path.name == "test_docker.py" and getattr(item, "originalname", item.name) not in NO_ENGINE


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if item.path.is_relative_to(here) and _needs_docker(item):
            item.add_marker(pytest.mark.docker)


@pytest.fixture(autouse=True)
def _engine_for_docker_tests(request: pytest.FixtureRequest) -> None:
    """The Docker engine for every test marked ``docker``, also when it runs alone."""
    if request.node.get_closest_marker("docker") is not None:
        request.getfixturevalue("docker_engine")


def docker_engine_up() -> bool:
    try:
        import docker

        docker.from_env(timeout=5).ping()
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def docker_engine() -> None:
    """A reachable Docker engine with the sandbox image: started by ``scripts/docker.sh`` if
    needed. Fails (never skips) when that is impossible, or when the test is not marked ``docker``."""
    require_mark("docker", "needs the Docker engine")
    if not docker_engine_up():
        proc = subprocess.run(
            [str(REPO / "scripts" / "docker.sh")], capture_output=True, text=True, timeout=900
        )
        if proc.returncode != 0 or not docker_engine_up():
            pytest.fail(f"scripts/docker.sh could not provide a Docker engine:\n{proc.stderr[-3000:]}")


class _Sandboxes:
    """Creates each backend's sandbox on first use; closes them all at the end."""

    def __init__(self) -> None:
        self.made: dict[str, Any] = {}

    def get(self, kind: str, request: pytest.FixtureRequest) -> Any:
        if kind == "docker":
            require_mark("docker", "uses the Docker sandbox")
        if kind not in self.made:
            self.made[kind] = self._make(kind, request)
        return self.made[kind]

    def _make(self, kind: str, request: pytest.FixtureRequest) -> Any:
        if kind.startswith("bubblewrap") and shutil.which("bwrap") is None:
            pytest.fail("bubblewrap is not installed (scripts/setup.sh installs it)")
        if kind == "bubblewrap-exec":
            return BubblewrapSandbox(warm=False, **SETTINGS)
        if kind == "bubblewrap-warm":
            sb = BubblewrapSandbox(warm=True, **SETTINGS)
            arun(sb.start)  # every execution below is served by a warm worker
            return sb
        if kind == "docker":
            request.getfixturevalue("docker_engine")
            from agentrl.sandbox.docker import DockerSandbox

            sb = DockerSandbox(**SETTINGS)
            arun(sb.start)
            return sb
        if kind == "unsafe-local":
            return UnsafeLocalSandbox(**SETTINGS)
        raise ValueError(kind)

    def close(self) -> None:
        for sb in self.made.values():
            arun(sb.aclose)


@pytest.fixture(scope="session")
def _all_sandboxes() -> Iterator[_Sandboxes]:
    registry = _Sandboxes()
    yield registry
    registry.close()


@pytest.fixture
def sandbox_of(_all_sandboxes: _Sandboxes, request: pytest.FixtureRequest) -> Callable[[str], SessionSandbox]:
    """``sandbox_of(kind)``: the session-wide sandbox of that backend."""
    return lambda kind: _all_sandboxes.get(kind, request)
