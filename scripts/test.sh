#!/usr/bin/env bash
# Set up (idempotent) and run the tests. Extra arguments go to pytest.
#   ./scripts/test.sh            the whole suite (what CI runs: .ci/run)
#   ./scripts/test.sh --quick    the quick tier: no vLLM engine, no `agentrl train`, no Docker
#                                daemon, no browser (the marks in pyproject.toml; a few minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
if [ "${1:-}" = "--quick" ]; then
    quick=1
    shift
fi
./scripts/setup.sh
if [ "$quick" = 1 ]; then
    exec .venv/bin/python -m pytest -m "not (vllm or e2e or docker or browser)" "$@"
fi
./scripts/browser.sh
exec .venv/bin/python -m pytest "$@"
