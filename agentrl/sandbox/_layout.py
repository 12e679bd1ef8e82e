"""The host layout a sandbox is built from, shared by :mod:`~agentrl.sandbox.bubblewrap`,
:mod:`~agentrl.sandbox.docker` and :mod:`~agentrl.sandbox.local`: which interpreter runs inside
and which host paths it needs (its prefixes, the system paths, the site-packages directories and
where they appear inside), and the identity and environment the code gets there.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import sysconfig
from collections.abc import Sequence

from agentrl.errors import SandboxError

#: The unprivileged identity the code runs as (``nobody``/``nogroup`` on Debian).
SANDBOX_UID = 65534
#: Size of the private ``/tmp`` tmpfs of each execution (bytes of host memory at most); warm trees
#: get one of this size for ``/tmp`` and one for ``/dev/shm``.
TMPFS_BYTES = 128 * 1024 * 1024
#: The environment inside the sandbox (everything else is cleared).
SANDBOX_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/tmp",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
}
#: System paths bound read-only when present (symlinks, e.g. merged-/usr ``/lib -> usr/lib``, are
#: recreated as symlinks).
SYSTEM_PATHS = ("/usr", "/bin", "/lib", "/lib64", "/etc/alternatives", "/etc/ld.so.cache")
#: Where the site-packages directories are bound inside (``/opt/site/0``, ``/opt/site/1``, ...).
SITE_MOUNT = "/opt/site"

_PRINT_PREFIXES = "import sys; print(sys.base_prefix); print(sys.base_exec_prefix)"


def base_python() -> str:
    """The real path of the base interpreter behind the running one (not a venv's shim)."""
    exe = getattr(sys, "_base_executable", None) or sys.executable
    real = os.path.realpath(exe)
    if os.path.isfile(real) and os.access(real, os.X_OK):
        return real
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    candidate = os.path.join(sys.base_prefix, "bin", f"python{version}")
    if os.access(candidate, os.X_OK):
        return os.path.realpath(candidate)
    raise SandboxError(f"cannot find the base Python interpreter (tried {exe!r} and {candidate!r})")


def resolve_python(python: str | None) -> tuple[str, list[str]]:
    """The interpreter's real path and the installation prefixes to bind for it."""
    if python is None:
        exe = base_python()
        prefixes = {sys.base_prefix, sys.base_exec_prefix}
    else:
        found = shutil.which(python)
        if found is None:
            raise SandboxError(f"bubblewrap sandbox: python interpreter {python!r} not found")
        exe = os.path.realpath(found)
        try:
            out = subprocess.run(
                [exe, "-I", "-S", "-c", _PRINT_PREFIXES],
                capture_output=True, text=True, timeout=30, check=True, env={},
            ).stdout.split("\n")
        except (OSError, subprocess.SubprocessError) as exc:
            raise SandboxError(f"bubblewrap sandbox: cannot run python {exe!r}: {exc}") from exc
        prefixes = {out[0], out[1]}
    paths = {os.path.realpath(p) for p in prefixes if p}
    if not any(is_within(exe, p) for p in paths) and not is_within(exe, "/usr"):
        paths.add(os.path.dirname(exe))
    return exe, sorted(paths)


def site_packages_binds(
    site_packages: Sequence[str] | None, python: str | None
) -> tuple[list[str], list[str]]:
    """The site-packages directories to bind (real host paths) and where each appears inside
    (``/opt/site/<i>``). ``None``: the running interpreter's (:func:`default_site_packages`) when
    ``python`` is not given, else none; directories that do not exist are dropped."""
    if site_packages is None:
        site_packages = default_site_packages() if python is None else []
    host = [os.path.realpath(p) for p in site_packages if os.path.isdir(p)]
    return host, [f"{SITE_MOUNT}/{i}" for i in range(len(host))]


def default_site_packages() -> list[str]:
    """The running interpreter's site-packages directories (its virtualenv's, if any)."""
    paths: list[str] = []
    candidates = [*site.getsitepackages(), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    for path in candidates:
        real = os.path.realpath(path)
        if os.path.isdir(real) and real not in paths:
            paths.append(real)
    return paths


def is_within(path: str, root: str) -> bool:
    """Whether ``path`` is ``root`` or below it (both real, absolute paths)."""
    return path == root or path.startswith(root.rstrip("/") + "/")
