"""The quick tier runs on every core (pytest-xdist, `--dist loadgroup`): tests that share a local
Ray or a session-built model must land in one group, so that one worker runs them all."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import xdist_group_of

ROOT = Path(__file__).resolve().parents[1]


class _Item:
    """The two things `xdist_group_of` reads from a pytest item: its marks and its fixtures."""

    def __init__(self, fixtures: tuple[str, ...] = (), marks: tuple[str, ...] = ()) -> None:
        self.fixturenames = list(fixtures)
        self._marks = marks

    def get_closest_marker(self, name: str) -> Any:
        return getattr(pytest.mark, name) if name in self._marks else None


def test_a_test_on_the_shared_ray_and_a_test_marked_ray_share_one_group() -> None:
    assert xdist_group_of(_Item(fixtures=("tmp_path", "ray_local"))) == "ray"  # type: ignore[arg-type]
    assert xdist_group_of(_Item(marks=("ray",))) == "ray"  # type: ignore[arg-type]
    # a test that starts its own Ray beside a session model still goes with the Ray tests
    assert xdist_group_of(_Item(fixtures=("smol_model",), marks=("ray",))) == "ray"  # type: ignore[arg-type]


def test_each_session_built_model_is_one_group_and_plain_tests_go_anywhere() -> None:
    assert xdist_group_of(_Item(fixtures=("tiny_llm",))) == "tiny_calc_model"  # type: ignore[arg-type]
    assert xdist_group_of(_Item(fixtures=("tiny_calc_model",))) == "tiny_calc_model"  # type: ignore[arg-type]
    assert xdist_group_of(_Item(fixtures=("smol_model", "tmp_path"))) == "smol_model"  # type: ignore[arg-type]
    assert xdist_group_of(_Item(fixtures=("tmp_path",))) is None  # type: ignore[arg-type]


def test_the_quick_tier_command_runs_on_every_core_by_group() -> None:
    script = (ROOT / "scripts" / "test.sh").read_text()
    quick = next(line for line in script.splitlines() if "not (vllm or e2e or docker or browser)" in line)
    assert "-n auto" in quick and "--dist loadgroup" in quick
    assert "pytest-xdist" in (ROOT / "pyproject.toml").read_text()


def _full_suite_parts() -> list[str]:
    """The ``-m`` expressions of the whole suite's pytest runs in scripts/test.sh (no arguments)."""
    script = (ROOT / "scripts" / "test.sh").read_text()
    lines = [line for line in script.splitlines() if "pytest -m" in line and "docker or browser" not in line]
    return [line.split('-m "', 1)[1].split('"', 1)[0] for line in lines]


def test_the_whole_suites_two_parts_run_every_test_once_and_only_light_ones_in_parallel() -> None:
    """Part 1 (on every core) and part 2 (one process) split every combination of marks: each test
    runs in exactly one part, and none that starts vLLM or `agentrl train` runs in part 1."""
    import itertools

    script = (ROOT / "scripts" / "test.sh").read_text()
    parts = _full_suite_parts()
    assert len(parts) == 2, parts
    parallel, serial = parts
    lines = script.splitlines()
    assert any(f'-m "{parallel}"' in line and "-n auto" in line and "--dist loadgroup" in line for line in lines)
    assert not any(f'-m "{serial}"' in line and "-n " in line for line in lines)
    marks = ("vllm", "e2e", "docker", "browser", "ray")
    for values in itertools.product((False, True), repeat=len(marks)):
        env = dict(zip(marks, values))
        in_parallel, in_serial = eval(parallel, {}, env), eval(serial, {}, env)  # noqa: S307 - the script's own marker expressions
        assert in_parallel != in_serial, env  # exactly one part
        if env["vllm"] or env["e2e"]:
            assert in_serial, env


def test_the_groups_reach_xdist_and_one_worker_runs_each(tmp_path: Path) -> None:
    # pytest 9.2 silently dropped xdist's group suffix (pytest-dev/pytest-xdist#1386), and groups
    # added in a conftest's modifyitems came after xdist had read them: in both cases each group's
    # tests were dealt to both workers, and the tests did not fail
    import subprocess
    import sys

    (tmp_path / "test_grouped.py").write_text(
        "import pytest\n\n"
        + "".join(f"@pytest.mark.ray\ndef test_ray_{i}():\n    pass\n\n\n" for i in range(4))
        + "".join(f"def test_plain_{i}():\n    pass\n\n\n" for i in range(4))
    )
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(tmp_path / "test_grouped.py"), "-p", "tests.conftest", "-n", "2", "--dist",
         "loadgroup", "-v", "-p", "no:cacheprovider", "--rootdir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    ran = [line.split() for line in proc.stdout.splitlines() if line.startswith("[gw") and "PASSED" in line]
    workers = {words[0] for words in ran if "::test_ray_" in words[-1]}
    assert len([w for w in ran if "::test_ray_" in w[-1]]) == 4 and len(workers) == 1, proc.stdout[-3000:]
    assert all(words[-1].endswith("@ray") for words in ran if "::test_ray_" in words[-1]), proc.stdout[-3000:]
