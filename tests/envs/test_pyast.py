"""agentrl.envs.pyast.parse: ``ast.parse`` made again when CPython's threads' race fails it with
"AST constructor recursion depth mismatch" on good source; every other error raised at once."""

from __future__ import annotations

import ast

import pytest

from agentrl.envs import pyast


def _flaky(monkeypatch: pytest.MonkeyPatch, failures: int, message: str) -> list[str]:
    """Make ``ast.parse`` fail ``failures`` times with ``SystemError(message)``, then parse."""
    real, calls = ast.parse, []

    def parse(source: str, filename: str = "<unknown>") -> ast.Module:
        calls.append(source)
        if len(calls) <= failures:
            raise SystemError(message)
        return real(source, filename=filename)

    monkeypatch.setattr(pyast.ast, "parse", parse)
    return calls


def test_the_race_is_made_again_until_the_source_parses(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _flaky(monkeypatch, 2, "AST constructor recursion depth mismatch (before=144, after=192)")
    tree = pyast.parse("x = 1 + 2")
    assert isinstance(tree.body[0], ast.Assign) and len(calls) == 3


def test_a_race_on_every_try_is_raised_after_the_last(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _flaky(monkeypatch, pyast.TRIES, "AST constructor recursion depth mismatch (before=3, after=9)")
    with pytest.raises(SystemError, match="recursion depth mismatch"):
        pyast.parse("x = 1")
    assert len(calls) == pyast.TRIES


def test_any_other_error_is_raised_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _flaky(monkeypatch, 1, "something else broke")
    with pytest.raises(SystemError, match="something else broke"):
        pyast.parse("x = 1")
    assert len(calls) == 1
    monkeypatch.undo()
    with pytest.raises(SyntaxError):
        pyast.parse("x = (")
    with pytest.raises(RecursionError):
        pyast.parse("+".join(["1"] * 5000))
