"""The command lines that start the in-sandbox runtime (:mod:`agentrl.sandbox.guest`).

Every sandboxed interpreter runs ``python -I -S -c <guest code> ...``: ``-I`` is isolated mode (no
``PYTHON*`` variables, no user site, no script directory on the path); ``-S`` skips ``site``, so
no site-packages (the standard library only, plus what the runtime appends to ``sys.path``) and a
fast start (the runtime supplies the ``exit``/``quit`` builtins that ``site`` would have added).

``<guest code>`` is the program of one mode (:func:`guest_program`): the guest package's files that
the mode needs, joined into one source text, then the call of the mode's entry function.
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

#: The guest package's directory: its files are the parts of one program
#: (:mod:`agentrl.sandbox.guest`).
GUEST_DIR = Path(__file__).parent / "guest"
#: The parts of the guest program, in the order they are joined (each needs only those before it).
GUEST_PARTS = ("wire", "limits", "execution", "oneshot", "trees", "warm", "docker_runner")
#: Each mode's parts of the guest program and its entry function (called with the config).
MODES: dict[str, tuple[tuple[str, ...], str]] = {
    "server": (("wire", "limits", "execution", "trees", "warm"), "server_main"),
    "runner": (("wire", "limits", "execution", "docker_runner"), "runner_main"),
    "reaper": (("wire", "limits", "execution", "docker_runner"), "reaper_main"),
    "session": (("wire", "limits", "execution"), "session_main"),
}
#: The module the guest's parts import each other from (those imports are dropped when joined).
_GUEST_PACKAGE = "agentrl.sandbox.guest"
#: Uid meaning "do not change identity" in :func:`oneshot_argv`.
NO_UID = -1


#: Where a warm server's container holds the compiled guest program (see :func:`guest_code`): in
#: the server's own /tmp, which every tree covers with a fresh tmpfs (the code never sees it).
GUEST_CODE_PATH = "/tmp/.agentrl-guest"


@functools.cache
def guest_part(name: str) -> str:
    """The source text of the guest's part ``name`` (``guest/<name>.py``)."""
    return (GUEST_DIR / f"{name}.py").read_text(encoding="utf-8")


def _body(source: str) -> str:
    """``source`` without its module docstring and its imports of the guest's other parts (the
    joined program holds their names already); every other line as it is."""
    module = ast.parse(source)
    drop: set[int] = set()
    for i, node in enumerate(module.body):
        docstring = i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        own = isinstance(node, ast.ImportFrom) and (node.module or "").startswith(_GUEST_PACKAGE)
        if docstring or own:
            drop.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    lines = source.splitlines(keepends=True)
    return "".join(line for n, line in enumerate(lines, 1) if n not in drop).strip("\n") + "\n"


@functools.cache
def guest_program(mode: str) -> str:
    """The guest program of ``mode`` (``server``, ``runner``, ``reaper`` or ``session``): the
    parts it needs (:data:`MODES`), joined, then its entry function called on the config
    (``sys.argv[2]``, JSON). Raises ValueError for an unknown mode."""
    if mode not in MODES:
        raise ValueError(f"unknown guest mode {mode!r}; known: {', '.join(MODES)}")
    parts, entry = MODES[mode]
    pieces = [_body(guest_part(name)) for name in parts]
    return "\n\n".join([*pieces, f"{entry}(json.loads(sys.argv[2]))\n"])


@functools.lru_cache(maxsize=4)
def _compiled(source: str) -> bytes:
    return marshal.dumps(compile(source, "<string>", "exec", dont_inherit=True))


def guest_code() -> bytes:
    """The warm server's program (:func:`guest_program` of ``server``) compiled by this
    interpreter, as ``marshal`` data: valid for an interpreter of the same minor version only.

    A warm server loads it instead of compiling the source: compiling 1,400 lines leaves a few MB
    of freed parser memory scattered among the live objects, which every fork of the server then
    maps (more page tables to copy at each fork and to tear down at each exit).
    """
    return _compiled(guest_program("server"))


def guest_argv(
    python: str, mode: str, config: dict[str, Any], code_path: str | None = None
) -> list[str]:
    """The command line that runs the guest program of ``mode`` (``server``, ``runner``,
    ``reaper`` or ``session``) with ``config``: from its source, or (``code_path``) from the
    file at that path inside the sandbox, holding :func:`guest_code` (``server`` only)."""
    if code_path is None:
        program = guest_program(mode)
    else:
        program = f"import marshal;exec(marshal.loads(open({code_path!r},'rb').read()))"
    return [python, "-I", "-S", "-c", program, mode, json.dumps(config)]


@functools.cache
def oneshot_source() -> str:
    """The one-shot bootstrap: :func:`agentrl.sandbox.guest.oneshot.oneshot_prelude` and what it
    needs (``ONESHOT_NAMES``), cut out of the guest's parts, then run on the user's code."""
    parts: dict[str, str] = {}
    for name in GUEST_PARTS:
        source = guest_part(name)
        for node in ast.parse(source).body:
            key = None
            if isinstance(node, ast.FunctionDef):
                key = node.name
            elif isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
                if isinstance(target, ast.Name):
                    key = target.id
            if key is not None:
                parts[key] = ast.get_source_segment(source, node) or ""
    names = ast.literal_eval(parts["ONESHOT_NAMES"].split("=", 1)[1].strip())
    pieces = [parts[name] for name in names]
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
