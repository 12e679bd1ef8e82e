"""The sandbox package's layout, read from its source: ``base.py`` is the public contract only, no
module imports another module's private (underscore) names, docker does not lean on bubblewrap,
and one in-sandbox runtime sets every rlimit. Plus the one meaning of ``memory_mb``, on every
backend, one-shot and in sessions."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agentrl.envs import pyast
from agentrl.sandbox import ExecResult, base

from .conftest import BACKENDS, arun, run

PACKAGE = Path(__file__).resolve().parents[2] / "agentrl" / "sandbox"
MODULES = sorted(PACKAGE.glob("*.py")) + sorted(PACKAGE.glob("guest/*.py"))
#: The guest's file that holds ``apply_limits``.
GUEST_LIMITS = PACKAGE / "guest" / "limits.py"


def _tree(path: Path) -> ast.Module:
    return pyast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _imports(path: Path) -> Iterator[tuple[str, str | None]]:
    """``(module, name)`` of every import in ``path`` (``name`` is ``None`` for ``import m``);
    relative imports are resolved against ``agentrl.sandbox``."""
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                parent = "agentrl.sandbox".rsplit(".", node.level - 1)[0]
                module = f"{parent}.{module}" if module else parent
            for alias in node.names:
                yield module, alias.name


def test_the_package_has_the_modules_this_test_knows() -> None:
    names = {str(p.relative_to(PACKAGE)) for p in MODULES}
    assert {"base.py", "_process.py", "_limits.py", "_layout.py", "_launch.py", "guest/limits.py"} <= names
    assert "_common.py" not in names


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_private_names_are_imported_from_other_modules(path: Path) -> None:
    private = [
        f"from {module} import {name}"
        for module, name in _imports(path)
        if module.startswith("agentrl") and name is not None and name.startswith("_")
    ]
    assert private == [], f"{path.name} imports private names of other modules: {private}"


def test_docker_does_not_import_bubblewrap() -> None:
    modules = {module for module, _ in _imports(PACKAGE / "docker.py")}
    assert not any(m == "agentrl.sandbox.bubblewrap" for m in modules), modules


def test_base_is_the_public_contract_only() -> None:
    defined = {
        node.name
        for node in _tree(PACKAGE / "base.py").body
        if isinstance(node, ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef)
    }
    assert defined == set(base.__all__)
    assert not {m for m, _ in _imports(PACKAGE / "base.py")} - {"__future__", "dataclasses", "typing"}


def test_only_the_guest_runtime_sets_rlimits() -> None:
    """One in-sandbox runtime: ``guest/limits.apply_limits`` is the only code that sets rlimits, and
    the one-shot bootstrap is cut out of the guest (not a second copy)."""
    for path in MODULES:
        calls = [
            node.lineno
            for node in ast.walk(_tree(path))
            if isinstance(node, ast.Attribute) and node.attr == "setrlimit"
        ]
        if path == GUEST_LIMITS:
            guest = _tree(path)
            owners = [
                f.name for f in ast.walk(guest) if isinstance(f, ast.FunctionDef)
                and any(isinstance(n, ast.Attribute) and n.attr == "setrlimit" for n in ast.walk(f))
            ]
            assert owners == ["apply_limits"], owners
        else:
            assert calls == [], f"{path.name} sets rlimits at lines {calls}"
    from agentrl.sandbox._launch import oneshot_source

    guest_source = GUEST_LIMITS.read_text(encoding="utf-8")
    guest = _tree(GUEST_LIMITS)
    apply_limits = next(f for f in guest.body if isinstance(f, ast.FunctionDef) and f.name == "apply_limits")
    assert ast.get_source_segment(guest_source, apply_limits) in oneshot_source()


# --- the one meaning of memory_mb ------------------------------------------------------------

#: Prints how far RLIMIT_AS is above the interpreter's address space when the code runs (MiB).
HEADROOM = (
    "import resource\n"
    "vm = next(int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith('VmSize:'))\n"
    "soft, hard = resource.getrlimit(resource.RLIMIT_AS)\n"
    "print(round((soft - vm) / 2**20))\n"
)


def _headroom(r: ExecResult) -> int:
    assert r.ok, r
    return int(r.stdout)


@pytest.mark.parametrize("kind", BACKENDS)
def test_memory_mb_is_on_top_of_the_interpreter(sandbox_of: Callable[[str], Any], kind: str) -> None:
    """``memory_mb`` is the address space the code may add to its interpreter, whether that is a
    fresh one (bubblewrap-exec, unsafe-local), a warm fork or a session's; the few MiB of slack
    are what the runtime itself allocates between setting the limit and running the code."""
    sb = sandbox_of(kind)
    assert 120 <= _headroom(run(sb, HEADROOM, memory_mb=128)) <= 128

    async def cells() -> list[ExecResult]:
        async with sb.session(memory_mb=128) as s:
            return [await s.run(HEADROOM), await s.run(HEADROOM, memory_mb=64)]

    whole, lower = arun(cells)
    assert 120 <= _headroom(whole) <= 128
    assert 56 <= _headroom(lower) <= 64
