#!/usr/bin/env bash
# Set up (idempotent) and run the tests. Extra arguments go to pytest.
#   ./scripts/test.sh            the whole suite (what CI runs: .ci/run), in two parts:
#                                  1. every test that starts no vLLM engine and no `agentrl train`
#                                     (the quick tier plus the Docker and browser tests), on every
#                                     core (pytest-xdist);
#                                  2. the vLLM and end-to-end tests, in one process: each of them
#                                     wants both cores, and two at once would only slow each other.
#                                Both parts always run; the suite fails if either does.
#   ./scripts/test.sh ARGS...    one pytest process over ARGS (e.g. a folder or `-k`), as plain pytest
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
if [ "$#" -gt 0 ]; then
    exec .venv/bin/python -m pytest "$@"
fi
parallel_rc=0
.venv/bin/python -m pytest -m "not (vllm or e2e)" -n auto --dist loadgroup || parallel_rc=$?
serial_rc=0
.venv/bin/python -m pytest -m "vllm or e2e" || serial_rc=$?
if [ "$parallel_rc" != 0 ] || [ "$serial_rc" != 0 ]; then
    echo "the suite failed: part 1 (no vLLM engine, no agentrl train; on every core) exited $parallel_rc," \
         "part 2 (vLLM and end-to-end; one process) exited $serial_rc" >&2
    exit 1
fi
