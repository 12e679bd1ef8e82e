"""The ``bwrap`` command lines of :class:`~agentrl.sandbox.bubblewrap.BubblewrapSandbox`: the
container both modes build (:func:`container_args`, the same for every execution of a sandbox, and
:func:`site_args`), the one-shot command line of per-execution mode (:func:`oneshot_command`) and a
warm fork server's (:func:`server_command`, with the capabilities it keeps, :data:`SERVER_CAPS`).

Why each argument is there is the design in :mod:`agentrl.sandbox.bubblewrap`'s docstring (the
empty root and its read-only binds, the namespaces, the identity under root and not); the
interpreter's half of each command line is :mod:`agentrl.sandbox._launch`'s.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from typing import Any

from agentrl.sandbox._launch import GUEST_CODE_PATH, NO_UID, guest_argv, oneshot_argv
from agentrl.sandbox._layout import (
    SANDBOX_ENV,
    SANDBOX_UID,
    SITE_MOUNT,
    SYSTEM_PATHS,
    TMPFS_BYTES,
    is_within,
)
from agentrl.sandbox._limits import Limits

__all__ = [
    "SERVER_CAPS", "bwrap_supports", "container_args", "oneshot_command", "server_command", "site_args",
]

#: Capabilities the warm server keeps (inside its own user namespace only).
SERVER_CAPS = (
    "CAP_SETUID", "CAP_SETGID", "CAP_SETFCAP", "CAP_SYS_ADMIN", "CAP_SYS_CHROOT", "CAP_NET_ADMIN",
)


def container_args(bwrap: str, prefixes: Sequence[str]) -> list[str]:
    """The arguments that build the container of both modes (a sandbox computes them once): it
    dies with its parent, runs in a new session with hostname ``sandbox`` and an environment
    cleared but for :data:`SANDBOX_ENV`; read-only binds of the :data:`SYSTEM_PATHS` that exist
    (links recreated as links) and of the interpreter's ``prefixes`` not already under one of
    them; a private ``/proc``, a minimal ``/dev``, and a world-writable tmpfs ``/tmp``, capped
    where ``bwrap`` supports ``--size``, as the working directory."""
    args = ["--die-with-parent", "--new-session", "--hostname", "sandbox", "--clearenv"]
    for key, value in SANDBOX_ENV.items():
        args += ["--setenv", key, value]
    bound: list[str] = []
    for path in SYSTEM_PATHS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.exists(path):
            args += ["--ro-bind", path, path]
            bound.append(os.path.realpath(path))
    for prefix in prefixes:
        if any(is_within(prefix, b) for b in bound):
            continue
        # Parents are created 0755 explicitly: bwrap would copy the host's modes (e.g. 0700
        # for /root), which uid 65534 could not traverse.
        parent = os.path.dirname(prefix)
        ancestors = []
        while parent not in ("/", ""):
            ancestors.append(parent)
            parent = os.path.dirname(parent)
        for directory in reversed(ancestors):
            args += ["--perms", "0755", "--dir", directory]
        args += ["--ro-bind", prefix, prefix]
        bound.append(prefix)
    args += ["--proc", "/proc", "--dev", "/dev"]
    if bwrap_supports(bwrap, "--size"):
        args += ["--size", str(TMPFS_BYTES)]
    # World-writable (sticky) like a normal /tmp: under root, bwrap creates it as uid 0.
    args += ["--perms", "1777", "--tmpfs", "/tmp", "--chdir", "/tmp"]
    return args


def site_args(site_packages: Sequence[str], site_inside: Sequence[str]) -> list[str]:
    """Read-only binds of the host's ``site_packages`` directories at ``site_inside`` (the
    ``/opt/site/<i>`` paths, under directories created 0755); none without site-packages."""
    if not site_packages:
        return []
    args = ["--perms", "0755", "--dir", "/opt", "--perms", "0755", "--dir", SITE_MOUNT]
    for host, inside in zip(site_packages, site_inside, strict=True):
        args += ["--ro-bind", host, inside]
    return args


def oneshot_command(
    bwrap: str, python: str, marker_fd: int, limits: Limits, userns: int | None,
    seccomp_fd: int | None, cgroup_fds: Sequence[int], *, mounts: Sequence[str],
    sys_path: Sequence[str],
) -> list[str]:
    """The one-shot command line: bwrap (``--seccomp seccomp_fd``: the filter, which bwrap
    installs right before it starts the interpreter), then :func:`oneshot_argv` (which joins
    ``cgroup_fds`` first).

    Args:
        bwrap: the ``bwrap`` executable.
        python: the interpreter inside.
        marker_fd: where the prelude writes its "started" byte.
        limits: the execution's limits.
        userns: under root, a descriptor of the user namespace (``0 -> 0``, ``65534 -> 65534``)
            the container enters as uid 0 with ``CAP_SETUID``/``CAP_SETGID`` only, the prelude
            then dropping to the sandbox uid; None: ``--unshare-all`` as uid 65534 directly.
        seccomp_fd: a pipe holding the filter's BPF program; None: no filter.
        cgroup_fds: ``cgroup.procs`` descriptors the interpreter joins before anything else.
        mounts: :func:`container_args` followed by :func:`site_args`.
        sys_path: the site-packages directories inside, appended to the code's ``sys.path``.
    """
    if userns is None:
        uid = str(SANDBOX_UID)
        head = [bwrap, "--unshare-all", "--uid", uid, "--gid", uid]
        drop_to = NO_UID
    else:
        head = [
            bwrap, "--userns", str(userns),
            "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
            "--unshare-cgroup-try",
            "--uid", "0", "--gid", "0",
            "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
        ]
        drop_to = SANDBOX_UID
    if seccomp_fd is not None:
        head += ["--seccomp", str(seccomp_fd)]
    argv = oneshot_argv(python, marker_fd, limits, drop_to, sys_path=sys_path, cgroup_fds=cgroup_fds)
    return [*head, *mounts, "--", *argv]


def server_command(
    bwrap: str, python: str, userns: int, config: dict[str, Any], mounts: Sequence[str],
    code_fd: int | None = None,
) -> list[str]:
    """A warm fork server's command line: bwrap entering ``userns`` as uid 0 with only
    :data:`SERVER_CAPS`, in IPC, PID, network, UTS (and, where possible, cgroup) namespaces of
    its own, running the guest in mode ``server`` with ``config``.

    Args:
        bwrap: the ``bwrap`` executable.
        python: the interpreter inside.
        userns: a descriptor of the worker's user namespace (``0 -> 0``, ``65534 -> 65534``).
        config: the server's configuration (:mod:`agentrl.sandbox.guest.warm`).
        mounts: :func:`container_args` followed by :func:`site_args`.
        code_fd: a descriptor holding the compiled guest, bound read-only at ``GUEST_CODE_PATH``
            in the server's own ``/tmp``; None: the guest's source goes on the command line.
    """
    caps: list[str] = []
    for cap in SERVER_CAPS:
        caps += ["--cap-add", cap]
    head = [
        bwrap, "--userns", str(userns),
        "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
        "--unshare-cgroup-try", "--uid", "0", "--gid", "0", "--cap-drop", "ALL", *caps,
    ]
    if code_fd is None:
        return [*head, *mounts, "--", *guest_argv(python, "server", config)]
    code = ["--ro-bind-data", str(code_fd), GUEST_CODE_PATH]
    argv = guest_argv(python, "server", config, code_path=GUEST_CODE_PATH)
    return [*head, *mounts, *code, "--", *argv]


def bwrap_supports(bwrap: str, option: str) -> bool:
    """Whether ``bwrap --help`` lists ``option`` (False when it cannot be run)."""
    try:
        text = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return option in text
