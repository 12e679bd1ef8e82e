"""Parsing Python source into an :mod:`ast` tree, without a CPython race's false error.

CPython keeps the counter that ``ast.parse`` uses to bound its recursion while it builds the
tree's Python objects in state that every thread of the process shares. When two threads build
AST objects at once (one of them may be the :mod:`traceback` module, which on Python 3.11
parses the failing line of each traceback it formats), one call can fail on good source with
``SystemError: AST constructor recursion depth mismatch (before=.., after=..)``
(python/cpython#106905 and the reports linked there). The failure is transient: the same call
made again succeeds. :func:`parse` makes it again, a few times; every other error (a
``SyntaxError``, a ``RecursionError`` on source nested too deep) is raised as ``ast.parse``
raises it.
"""

from __future__ import annotations

import ast

__all__ = ["parse"]

RACE = "AST constructor recursion depth mismatch"
"""The start of the message of the race's ``SystemError``."""
TRIES = 5
"""Calls of ``ast.parse`` at most, the first included."""


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    """``ast.parse(source, filename)``, made again (up to :data:`TRIES` calls in all) when it
    fails with the threads' race (:data:`RACE`); the race's error is raised when every call hit it."""
    for attempt in range(TRIES):
        try:
            return ast.parse(source, filename=filename)
        except SystemError as exc:
            if not str(exc).startswith(RACE) or attempt == TRIES - 1:
                raise
    raise AssertionError("unreachable")  # the loop returns or raises
