#!/usr/bin/env bash
# The soak of tests/e2e/soak.py (an hour at twice capacity by default), in the e2e venv.
#   tests/e2e/run_soak.sh BUILD_DIR [--duration S] [--load X] [--report FILE]
set -euo pipefail
METRO_E2E_SCRIPT=soak.py exec "$(dirname "$0")/run_e2e.sh" "$@"
