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
