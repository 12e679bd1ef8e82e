#!/usr/bin/env bash
# Make a Docker engine available for the 'docker' sandbox and build its image. Idempotent: with
# the engine up and the image built it returns in about a second.
#
#   1. installs the Debian package docker.io if dockerd is missing (root + apt-get only);
#   2. starts `dockerd --storage-driver=vfs` in the background if the engine does not answer, and
#      waits (AGENTRL_DOCKER_WAIT_S, default 90 s) until it does;
#   3. builds the sandbox image from local files (no registry): `python -m agentrl.sandbox.docker
#      build-image` with the project's virtual environment.
#
#   AGENTRL_DOCKERD_LOG   where dockerd's output goes (default /var/log/agentrl-dockerd.log)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/detach.sh
ROOT=$(pwd)
PY="$ROOT/.venv/bin/python"
WAIT_S=${AGENTRL_DOCKER_WAIT_S:-90}
DOCKERD_LOG=${AGENTRL_DOCKERD_LOG:-/var/log/agentrl-dockerd.log}
log() { printf '[docker] %s\n' "$*" >&2; }

engine_up() {
    if [ -x "$PY" ]; then
        "$PY" -c "import docker, sys; docker.from_env(timeout=5).ping()" >/dev/null 2>&1
    else
        docker info >/dev/null 2>&1
    fi
}

# --- 1. the engine's package -------------------------------------------------------------------
if ! engine_up && ! command -v dockerd >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        log "installing docker.io (the Docker engine)"
        export DEBIAN_FRONTEND=noninteractive
        (apt-get install -y -q --no-install-recommends docker.io >/dev/null 2>&1 \
            || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends docker.io >/dev/null; }) \
            || { log "ERROR: could not install docker.io with apt-get"; exit 1; }
    else
        log "ERROR: the Docker engine (dockerd) is missing and this script cannot install it (not root or no apt-get)."
        log "       Install it with your package manager, e.g.: sudo apt-get install docker.io"
        exit 1
    fi
fi

# --- 2. the daemon -----------------------------------------------------------------------------
if ! engine_up; then
    if [ "$(id -u)" != 0 ]; then
        log "ERROR: the Docker engine is not running and only root can start it here (or set DOCKER_HOST)."
        exit 1
    fi
    log "starting dockerd --storage-driver=vfs (log: $DOCKERD_LOG)"
    mkdir -p "$(dirname "$DOCKERD_LOG")"
    # its own session, detached from this shell and its open files (scripts/detach.sh)
    start_detached "$DOCKERD_LOG" dockerd --storage-driver=vfs
    waited=0
    until engine_up; do
        if [ "$waited" -ge "$WAIT_S" ]; then
            log "ERROR: dockerd did not answer within ${WAIT_S} s; the end of its log:"
            tail -n 20 "$DOCKERD_LOG" >&2 || true
            exit 1
        fi
        sleep 1
        waited=$((waited + 1))
    done
    log "dockerd is up (${waited} s)"
fi

# --- 3. the sandbox image ------------------------------------------------------------------------
if [ ! -x "$PY" ]; then
    log "ERROR: $PY is missing: run scripts/setup.sh first (it calls this script at its end)"
    exit 1
fi
"$PY" -m agentrl.sandbox.docker build-image >/dev/null
