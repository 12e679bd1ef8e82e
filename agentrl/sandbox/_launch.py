"""The command lines that start the in-sandbox runtime (:mod:`agentrl.sandbox._guest`).

Every sandboxed interpreter runs ``python -I -S -c <guest code> ...``: ``-I`` is isolated mode (no
``PYTHON*`` variables, no user site, no script directory on the path); ``-S`` skips ``site``, so
no site-packages (the standard library only, plus what the runtime appends to ``sys.path``) and a
fast start (the runtime supplies the ``exit``/``quit`` builtins that ``site`` would have added).
"""

from __future__ import annotations

import ast
import functools
import json
import marshal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentrl.sandbox._limits import Limits

#: The guest program's source text (run inside sandboxes with ``python -I -S -c``).
GUEST_SOURCE = (Path(__file__).parent / "_guest.py").read_text(encoding="utf-8")
#: Uid meaning "do not change identity" in :func:`oneshot_argv`.
NO_UID = -1


#: Where a warm server's container holds the compiled guest program (see :func:`guest_code`): in
#: the server's own /tmp, which every tree covers with a fresh tmpfs (the code never sees it).
GUEST_CODE_PATH = "/tmp/.agentrl-guest"


@functools.lru_cache(maxsize=4)
def _compiled(source: str) -> bytes:
    return marshal.dumps(compile(source, "<string>", "exec", dont_inherit=True))


def guest_code() -> bytes:
    """The guest program compiled by this interpreter, as ``marshal`` data: valid for an
    interpreter of the same minor version only.

    A warm server loads it instead of compiling the source: compiling 1,600 lines leaves a few MB
    of freed parser memory scattered among the live objects, which every fork of the server then
    maps (more page tables to copy at each fork and to tear down at each exit).
    """
    return _compiled(GUEST_SOURCE)


def guest_argv(
    python: str, mode: str, config: dict[str, Any], code_path: str | None = None
) -> list[str]:
    """The command line that runs the guest program in ``mode`` (``server``, ``runner``,
    ``reaper`` or ``session``) with ``config``: from its source, or (``code_path``) from the
    file at that path inside the sandbox, holding :func:`guest_code`."""
    if code_path is None:
        program = GUEST_SOURCE
    else:
        program = f"import marshal;exec(marshal.loads(open({code_path!r},'rb').read()))"
    return [python, "-I", "-S", "-c", program, mode, json.dumps(config)]


@functools.cache
def oneshot_source() -> str:
    """The one-shot bootstrap: :func:`agentrl.sandbox._guest.oneshot_prelude` and what it needs
    (``_guest.ONESHOT_NAMES``), cut out of the guest's source, then run on the user's code."""
    module = ast.parse(GUEST_SOURCE)
    parts: dict[str, ast.stmt] = {}
    for node in module.body:
        if isinstance(node, ast.FunctionDef):
            parts[node.name] = node
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                parts[target.id] = node
    names = ast.literal_eval(parts["ONESHOT_NAMES"].value)  # type: ignore[attr-defined]
    pieces = [ast.get_source_segment(GUEST_SOURCE, parts[name]) or "" for name in names]
    return "\n".join(["import os, sys", *pieces, "exec(oneshot_prelude())", ""])


def oneshot_argv(
    python: str, marker_fd: int, limits: Limits, uid: int = NO_UID, sys_path: Sequence[str] = (),
    cgroup_fds: Sequence[int] = (),
) -> list[str]:
    """The interpreter command line of a one-shot execution (the code goes to its stdin): it joins
    the cgroups of ``cgroup_fds`` (``cgroup.procs`` descriptors it inherits), drops to ``uid``
    (unless :data:`NO_UID`), applies ``limits``, writes a byte to ``marker_fd`` once set up, and
    runs the code with ``sys_path`` appended to its ``sys.path``."""
    return [
        python,
        "-I",
        "-S",
        "-c",
        oneshot_source(),
        str(marker_fd),
        str(uid),
        str(limits.cpu_s),
        str(limits.memory_bytes),
        str(limits.fsize_bytes),
        str(limits.nofile),
        str(limits.nproc),
        *([":".join(sys_path)] if sys_path or cgroup_fds else []),
        *([",".join(str(fd) for fd in cgroup_fds)] if cgroup_fds else []),
    ]
