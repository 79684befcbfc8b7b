#!/usr/bin/env bash
# End-to-end tests of `metro serve` (tests/e2e/server_e2e.py) in a Python venv under the
# build dir, with the exact package versions of tests/e2e/requirements.txt from PyPI.
#   tests/e2e/run_e2e.sh BUILD_DIR [extra args for server_e2e.py]
# METRO_E2E_SCRIPT names another script of tests/e2e to run the same way (run_soak.sh).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BUILD="$(cd "${1:-$ROOT/build}" && pwd)"
shift || true
MODEL="${METRO_MODEL:-$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
VENV="$BUILD/e2e-venv"
REQ="$ROOT/tests/e2e/requirements.txt"
STAMP="$VENV/.requirements.sha256"
want="$(sha256sum "$REQ" | cut -d' ' -f1)"
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
  echo "e2e: creating $VENV"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check -r "$REQ"
  echo "$want" > "$STAMP"
fi
# promtool checks /metrics and the alerting rules under deploy/prometheus.
METRO_PROMTOOL="$("$ROOT/scripts/promtool.sh" "$BUILD/promtool")"
export METRO_PROMTOOL
exec "$VENV/bin/python" "$ROOT/tests/e2e/${METRO_E2E_SCRIPT:-server_e2e.py}" --metro "$BUILD/bin/metro" --model "$MODEL" "$@"
