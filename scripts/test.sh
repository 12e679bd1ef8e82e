#!/usr/bin/env bash
# Set up (idempotent) and run the tests. Extra arguments go to pytest.
#   ./scripts/test.sh            the whole suite (what CI runs: .ci/run)
#   ./scripts/test.sh --quick    the quick tier: no vLLM engine, no `agentrl train`, no Docker
#                                daemon, no browser (the marks in pyproject.toml), on every core
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
if [ "${1:-}" = "--quick" ]; then
    quick=1
    shift
fi
./scripts/setup.sh
if [ "$quick" = 1 ]; then
    # On every core (pytest-xdist); tests that share a local Ray or a session-built model stay on
    # one worker (tests/conftest.py). `-n 0` after --quick runs it in one process.
    exec .venv/bin/python -m pytest -m "not (vllm or e2e or docker or browser)" -n auto --dist loadgroup "$@"
fi
./scripts/browser.sh
exec .venv/bin/python -m pytest "$@"
