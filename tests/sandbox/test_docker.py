"""The Docker backend: locked-down containers, recycling, infrastructure errors, the image.

The Docker engine is provided by ``scripts/docker.sh`` (see conftest): these tests never skip.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import anyio
import pytest

from agentrl.errors import SandboxError, SandboxUnavailable
from agentrl.sandbox import ExecResult, create_sandbox

from .conftest import REPO, arun, run

SandboxOf = Callable[[str], Any]


def containers_of(pid: int) -> list[str]:
    import docker

    from agentrl.sandbox.docker import LABEL

    client = docker.from_env()
    return [c.id for c in client.containers.list(all=True, filters={"label": f"{LABEL}={pid}"})]


def test_unreachable_engine_is_unavailable(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    from agentrl.sandbox.docker import DockerSandbox

    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
    with pytest.raises(SandboxUnavailable, match="scripts/docker.sh"):
        DockerSandbox()
    with pytest.raises(SandboxUnavailable):
        create_sandbox("docker")


def test_containers_are_locked_down(sandbox_of: SandboxOf) -> None:
    sb = sandbox_of("docker")
    code = (
        "import json, os\n"
        "status = dict(l.split(':\\t', 1) for l in open('/proc/self/status').read().splitlines() if ':\\t' in l)\n"
        "out = {'ids': [os.getuid(), os.geteuid(), os.getgid()], 'cap': status['CapEff'].strip(),\n"
        "       'prm': status['CapPrm'].strip(), 'nnp': status['NoNewPrivs'].strip()}\n"
        "try:\n"
        "    open('/agentrl-x', 'w')\n"
        "    out['root'] = 'writable'\n"
        "except OSError as e:\n"
        "    out['root'] = e.errno\n"
        "print(json.dumps(out))\n"
    )
    r = run(sb, code)
    assert r.ok, r
    out = json.loads(r.stdout)
    assert out["ids"] == [65534, 65534, 65534]
    assert out["cap"] == out["prm"] == "0000000000000000" and out["nnp"] == "1"
    assert out["root"] == 30  # EROFS

    import docker

    cid = sb._idle[0].id
    host = docker.from_env().api.inspect_container(cid)["HostConfig"]
    assert host["NetworkMode"] == "none" and host["ReadonlyRootfs"] is True
    assert host["CapDrop"] == ["ALL"] and sorted(host["CapAdd"]) == ["KILL", "SETGID", "SETUID"]
    assert "no-new-privileges" in host["SecurityOpt"]
    assert host["Memory"] == sb.container_memory_mb << 20 and host["MemorySwap"] == host["Memory"]
    assert host["PidsLimit"] == sb.max_processes + 16 and host["NanoCpus"] == int(sb.cpus * 1e9)
    assert "/tmp" in host["Tmpfs"]


def test_broken_container_is_recycled_and_the_run_is_a_sandbox_error() -> None:
    from agentrl.sandbox.docker import DockerSandbox

    async def go() -> tuple[list[BaseException], ExecResult, str, str]:
        import docker

        async with DockerSandbox(max_concurrency=1, timeout_s=20.0) as sb:
            await sb.start()
            first_id = sb._idle[0].id
            errors: list[BaseException] = []

            async def victim() -> None:
                try:
                    await sb.run("import time\ntime.sleep(30)")
                except SandboxError as exc:
                    errors.append(exc)

            async with anyio.create_task_group() as tg:
                tg.start_soon(victim)
                await anyio.sleep(1.0)
                await anyio.to_thread.run_sync(docker.from_env().api.kill, first_id)
            after = await sb.run("print('recycled')")
            return errors, after, first_id, sb._idle[0].id

    errors, after, first_id, second_id = arun(go)
    assert len(errors) == 1, errors
    assert after.ok and after.stdout == "recycled\n"
    assert second_id != first_id


@pytest.mark.parametrize("loop", ["asyncio", "trio"])
def test_aclose_removes_the_containers(loop: str) -> None:
    from agentrl.sandbox.docker import DockerSandbox

    async def go() -> set[str]:
        async with DockerSandbox(max_concurrency=2) as sb:
            await sb.start()
            assert (await sb.run("print(1)")).stdout == "1\n"
            ours = set(sb._all)
            assert len(ours) == 2 and ours <= set(containers_of(os.getpid()))
            return ours

    ours = arun(go, loop)
    assert not ours & set(containers_of(os.getpid()))


def test_concurrent_runs_use_separate_containers(sandbox_of: SandboxOf) -> None:
    sb = sandbox_of("docker")

    async def go() -> tuple[list[ExecResult], float]:
        results: list[ExecResult] = []

        async def one(i: int) -> None:
            results.append(await sb.run(f"import time\ntime.sleep(0.5)\nprint({i})"))

        t0 = time.monotonic()
        async with anyio.create_task_group() as tg:
            for i in range(2):
                tg.start_soon(one, i)
        return results, time.monotonic() - t0

    results, elapsed = arun(go)
    assert sorted(r.stdout for r in results) == ["0\n", "1\n"]
    assert elapsed < 2.0  # both at once, not one after the other


def test_image_is_built_from_local_files() -> None:
    from agentrl.sandbox.docker import ensure_image, image_tag

    assert ensure_image() == image_tag()  # idempotent
    proc = subprocess.run(
        [sys.executable, "-m", "agentrl.sandbox.docker", "build-image"],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )
    assert proc.returncode == 0 and proc.stdout.startswith(image_tag()), proc.stderr


def test_cancelled_run_does_not_reuse_its_container() -> None:
    from agentrl.sandbox.docker import DockerSandbox

    async def go() -> tuple[str, str, ExecResult]:
        async with DockerSandbox(max_concurrency=1, timeout_s=30.0) as sb:
            await sb.start()
            first_id = sb._idle[0].id
            with anyio.move_on_after(1.0):
                await sb.run("import time\ntime.sleep(30)")
                raise AssertionError("should have been cancelled")
            after = await sb.run("import os\nprint(len([p for p in os.listdir('/proc') if p.isdigit()]))")
            return first_id, sb._idle[0].id, after

    first_id, second_id, after = arun(go)
    assert second_id != first_id  # the busy container was removed, not handed out again
    assert after.ok and int(after.stdout) <= 4, after  # init, runner, code (and its helper)
