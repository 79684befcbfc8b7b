#!/usr/bin/env bash
# Packs what scripts/gpu_check.sh needs on a GPU machine into BUILD_DIR/gpu/ (ignored by git),
# small enough for a 64 MiB transfer with the source tree:
#   BUILD_DIR/gpu/bin.tar.xz    metro and metro_tests, stripped
#   BUILD_DIR/gpu/model.gguf    the default model cut to LAYERS layers (scripts/gguf_truncate.py):
#                               the whole one (94 MiB) does not fit the transfer; FULL_MODEL=1
#                               copies it whole instead, for a machine that can take it
#
#   scripts/gpu_bundle.sh [BUILD_DIR]     (BUILD_DIR defaults to build-cuda; LAYERS=8)
#
# On the GPU machine, `scripts/gpu_check.sh OUT_DIR BUILD_DIR` unpacks the binaries and uses
# the model when the build directory holds no binaries and MODEL is unset.
set -euo pipefail
BUILD=${1:-build-cuda}
LAYERS=${LAYERS:-8}
MODEL_SRC=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
cd "$(dirname "$0")/.."
OUT=$BUILD/gpu
rm -rf "$OUT"
mkdir -p "$OUT/stage/bin"
for b in metro metro_tests; do
  [[ -x $BUILD/bin/$b ]] || { echo "missing $BUILD/bin/$b: build it first (docs/cuda.md)" >&2; exit 1; }
  strip -o "$OUT/stage/bin/$b" "$BUILD/bin/$b"
done
tar -C "$OUT/stage" -cJf "$OUT/bin.tar.xz" bin
rm -rf "$OUT/stage"
if [[ ${FULL_MODEL:-0} == 1 ]]; then
  cp -L "$MODEL_SRC" "$OUT/model.gguf"
else
  python3 scripts/gguf_truncate.py "$MODEL_SRC" "$OUT/model.gguf" "$LAYERS"
fi
tree_bytes=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
bundle_bytes=$(du -cb "$OUT"/* | tail -1 | cut -f1)
total=$(( tree_bytes + bundle_bytes ))
ls -l "$OUT"
echo "source tree $(( tree_bytes >> 20 )) MiB + bundle $(( bundle_bytes >> 20 )) MiB = $(( total >> 20 )) MiB (limit 64 MiB)"
(( total < 64 << 20 )) || { echo "too large for one transfer: lower LAYERS" >&2; exit 1; }
echo "carry: $OUT    then run: scripts/gpu_check.sh OUT_DIR $BUILD"
