"""The package's import graph has no cycle, counting imports inside functions too (a cycle
hidden by a function-level import is still two modules that cannot be understood apart)."""

from __future__ import annotations

import ast
from pathlib import Path

from agentrl.envs import pyast

PACKAGE = Path(__file__).resolve().parents[1] / "agentrl"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str], type_checking: bool = False) -> set[str]:
    """The agentrl modules ``path`` imports (``from agentrl.x import y`` names module
    ``agentrl.x.y`` when that is a module, else ``agentrl.x``); TYPE_CHECKING blocks excluded
    unless ``type_checking``."""
    tree = pyast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if not type_checking and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(n) for n in ast.walk(node)}
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            if not base.startswith("agentrl"):
                continue
            for a in node.names:
                full = f"{base}.{a.name}"
                out.add(full if full in modules else base)
    out.discard(here)
    return {m for m in out if m in modules}


def graph(type_checking: bool = False) -> dict[str, set[str]]:
    files = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(f) for f in files}
    g = {module_name(f): imports_of(f, modules, type_checking) for f in files}
    # a package's __init__ runs before any of its modules: importing agentrl.x.y imports agentrl.x
    return g


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in g:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_in_agentrl():
    assert cycles(graph()) == []


def test_no_import_cycle_in_agentrl_counting_type_annotations():
    # a cycle through TYPE_CHECKING imports is still two modules that cannot be read apart
    assert cycles(graph(type_checking=True)) == []


def test_the_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_another_modules_private_names():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(pyast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("agentrl"):
                offenders += [f"{path.relative_to(PACKAGE.parent)}: {node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
    assert offenders == []


def test_import_agentrl_registers_the_builtin_envs_cheaply_in_a_fresh_interpreter():
    import subprocess
    import sys

    code = (
        "import sys, gymnasium as gym\n"
        "env = gym.make('agentrl:agentrl/Calc-v0')\n"
        "assert type(env.unwrapped).__name__ == 'CalcEnv'\n"
        "import agentrl\n"
        "assert gym.make('agentrl/Math-v0').unwrapped.__class__.__name__ == 'MathEnv'\n"
        "print(sorted(m for m in ('torch', 'vllm', 'ray') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    light = subprocess.run([sys.executable, "-c", "import sys, agentrl; print(sorted(m for m in ('torch', 'vllm', 'ray', 'transformers') if m in sys.modules))"],
                           capture_output=True, text=True, timeout=120)
    assert light.stdout.strip() == "[]", light.stdout + light.stderr


# The engine's wings (docs/architecture.md) and what each may import of the engine. Dependencies
# point one way: common <- generation <- training; common <- rewards <- episodes; the loop drives
# generation and training; the run's plumbing at the top (engine/*.py) may import every wing.
WING_IMPORTS = {
    "common": set(),
    "generation": {"common"},
    "training": {"common", "generation"},
    "rewards": {"common"},
    "episodes": {"common", "rewards"},
    "loop": {"common", "generation", "training"},
}


def wing_of(module: str) -> str | None:
    """``agentrl.engine.<wing>.<module>``'s wing; "top" for the engine's own modules; None
    outside the engine."""
    parts = module.split(".")
    if parts[:2] != ["agentrl", "engine"]:
        return None
    return parts[2] if len(parts) > 3 else "top"


def wing_violations(g: dict[str, set[str]]) -> list[str]:
    """Imports that break WING_IMPORTS: a wing reaching a wing it may not, the engine's top
    included (the package's edges outside the engine, such as the CLI, may use any part)."""
    out = []
    for module, deps in sorted(g.items()):
        here = wing_of(module)
        if here in (None, "top"):
            continue
        for dep in sorted(deps):
            there = wing_of(dep)
            if there is None or there == here:
                continue
            if there not in WING_IMPORTS.get(here, set()):
                out.append(f"{module} -> {dep} ({here} may import {sorted(WING_IMPORTS[here]) or 'no other wing'})")
    return out


def test_every_engine_module_lives_in_a_known_wing_or_the_top():
    wings = {wing_of(m) for m in graph()} - {None, "top"}
    assert wings == set(WING_IMPORTS)


def test_each_wing_imports_only_the_wings_below_it():
    assert wing_violations(graph()) == []


def test_the_wing_rule_finds_an_arrow_that_points_up():
    g = {"agentrl.engine.common.trajectory": {"agentrl.engine.loop.loop"},
         "agentrl.engine.rewards.judge": {"agentrl.engine.episodes.rollout", "agentrl.engine.common.trajectory"},
         "agentrl.engine.loop.loop": {"agentrl.engine.controller"},
         "agentrl.engine.controller": {"agentrl.engine.loop.loop"}}
    assert [v.split(" (")[0] for v in wing_violations(g)] == [
        "agentrl.engine.common.trajectory -> agentrl.engine.loop.loop",
        "agentrl.engine.loop.loop -> agentrl.engine.controller",
        "agentrl.engine.rewards.judge -> agentrl.engine.episodes.rollout",
    ]


def test_the_recipe_layer_imports_nothing_of_the_engine():
    assert sorted(d for d in graph()["agentrl.config"] if d.startswith("agentrl.engine")) == []


def reachable(g: dict[str, set[str]], start: str) -> set[str]:
    """Every module ``start`` imports, directly or through the modules it imports."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += g.get(module, set())
    return seen - {start}


def test_the_recipe_layer_reaches_nothing_of_the_engine_through_other_modules():
    # config.py's own helpers (judge_prompt, model_plan, errors) must not pull the engine in either
    assert sorted(m for m in reachable(graph(), "agentrl.config") if m.startswith("agentrl.engine")) == []


# DESIGN.md (Packages): dependencies point one way, engine -> envs, sandbox, algos; envs -> sandbox;
# never back. What each package below the engine may not import of agentrl.
BELOW_THE_ENGINE = {
    "agentrl.envs": ("agentrl.engine",),
    "agentrl.sandbox": ("agentrl.engine", "agentrl.envs"),
    "agentrl.algos": ("agentrl.engine", "agentrl.envs", "agentrl.sandbox"),
    "agentrl.models": ("agentrl.engine",),
}


def upward_imports(g: dict[str, set[str]]) -> list[str]:
    """Imports of a package below the engine that point back up (:data:`BELOW_THE_ENGINE`)."""
    out = []
    for module, deps in sorted(g.items()):
        for package, forbidden in BELOW_THE_ENGINE.items():
            if module == package or module.startswith(package + "."):
                out += [f"{module} -> {dep}" for dep in sorted(deps) if any(dep == f or dep.startswith(f + ".") for f in forbidden)]
    return out


def test_the_packages_below_the_engine_never_import_back_up():
    assert upward_imports(graph(type_checking=True)) == []
