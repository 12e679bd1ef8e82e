#!/usr/bin/env bash
# Headless Chromium for the tests that open the HTML report in a real browser: Debian's chromium
# and chromium-driver (the matching WebDriver). Idempotent: returns at once when both are there.
set -euo pipefail
log() { printf '[browser] %s\n' "$*" >&2; }
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "installing chromium and chromium-driver (the report's browser tests)"
    (apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q chromium chromium-driver >/dev/null; }) \
        || { log "ERROR: could not install chromium and chromium-driver with apt-get"; exit 1; }
else
    log "ERROR: chromium and chromedriver are missing and this script cannot install them (not root or no apt-get)."
    log "       Install them with your package manager, e.g.: sudo apt-get install chromium chromium-driver"
    exit 1
fi
