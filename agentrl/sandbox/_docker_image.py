"""The Docker sandbox's image and engine client: a tiny local image (an empty root filesystem with
``/etc/passwd`` and the host's top-level symlinks, imported from a tarball, so no registry is
needed), named by a hash of its content, and the client of the local engine. The containers made
from it are :mod:`agentrl.sandbox.docker`'s."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import tarfile
from typing import Any

from agentrl.errors import SandboxError, SandboxUnavailable
from agentrl.sandbox._layout import SANDBOX_UID, SYSTEM_PATHS

__all__ = ["IMAGE_REPOSITORY", "UNAVAILABLE_HINT", "docker_client", "ensure_image", "host_layout", "image_tag", "image_tarball"]

log = logging.getLogger("agentrl.sandbox.docker")

#: Repository name of the sandbox image (the tag is a hash of its content).
IMAGE_REPOSITORY = "agentrl-sandbox"

UNAVAILABLE_HINT = (
    "the Docker engine is not reachable{detail}; run `scripts/docker.sh` (installs the Debian "
    "`docker.io` package if needed, starts `dockerd --storage-driver=vfs` and builds the sandbox "
    "image), or set DOCKER_HOST, or choose the 'bubblewrap' sandbox"
)


def docker_client(timeout_s: float = 60.0) -> Any:
    """A ``docker.DockerClient`` for the local engine (``DOCKER_HOST`` or the default socket).

    Raises:
        SandboxUnavailable: the ``docker`` package is missing or the engine does not answer.
    """
    try:
        import docker
    except ImportError as exc:  # pragma: no cover - a dependency of agentrl
        raise SandboxUnavailable("the `docker` Python package is not installed") from exc
    try:
        client = docker.from_env(timeout=int(timeout_s))
        client.ping()
    except Exception as exc:  # docker.errors.DockerException, requests errors, OSError
        raise SandboxUnavailable(UNAVAILABLE_HINT.format(detail=f" ({exc})")) from exc
    return client


def host_layout() -> list[tuple[str, str]]:
    """The host's top-level symlinks the image must copy (e.g. ``/lib -> usr/lib``)."""
    links = []
    for path in (*SYSTEM_PATHS, "/sbin"):
        if os.path.dirname(path) == "/" and os.path.islink(path):
            links.append((path.lstrip("/"), os.readlink(path)))
    return links


def image_tag() -> str:
    """The sandbox image's name for this host: ``agentrl-sandbox:<hash of its content>``."""
    spec = json.dumps({"version": 1, "links": host_layout(), "uid": SANDBOX_UID})
    return f"{IMAGE_REPOSITORY}:{hashlib.sha256(spec.encode()).hexdigest()[:12]}"


def image_tarball() -> bytes:
    """A minimal root filesystem: mount points, ``/etc/passwd``, ``/etc/group``, the host's
    top-level symlinks. Everything else is bound read-only from the host at run time."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:

        def add_dir(name: str, mode: int = 0o755) -> None:
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, mode
            tar.addfile(info)

        def add_file(name: str, text: str) -> None:
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))

        links = dict(host_layout())
        for name in ("etc", "tmp", "proc", "dev", "sys", "opt", "root", "usr"):
            add_dir(name, 0o1777 if name == "tmp" else 0o755)
        add_dir("opt/site")
        for name, target in links.items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
        uid = SANDBOX_UID
        add_file("etc/passwd", f"root:x:0:0:root:/root:/bin/false\nsandbox:x:{uid}:{uid}:sandbox:/tmp:/bin/false\n")
        add_file("etc/group", f"root:x:0:\nsandbox:x:{uid}:\n")
        add_file("etc/hostname", "sandbox\n")
    return buf.getvalue()


def ensure_image(client: Any | None = None) -> str:
    """Build the sandbox image from local files if this engine does not have it; return its tag.

    Raises:
        SandboxUnavailable: the engine is not reachable.
        SandboxError: the image could not be imported.
    """
    client = client or docker_client()
    tag = image_tag()
    try:
        client.images.get(tag)
        return tag
    except Exception as exc:  # docker.errors.ImageNotFound
        if type(exc).__name__ != "ImageNotFound":
            raise SandboxError(f"docker sandbox: cannot inspect image {tag}: {exc}") from exc
    repo, version = tag.split(":")
    try:
        client.api.import_image_from_data(image_tarball(), repository=repo, tag=version)
        client.images.get(tag)
    except Exception as exc:
        raise SandboxError(f"docker sandbox: cannot build image {tag}: {exc}") from exc
    log.info("docker sandbox: built image %s", tag)
    return tag
