#!/usr/bin/env bash
# Side-by-side speed of metro and llama.cpp on the same GGUF files, interleaved A B A B.
#
#   bench/compare_llamacpp.sh LLAMA_CPP_BIN_DIR [MODEL...]
#
# LLAMA_CPP_BIN_DIR holds llama-bench and llama-batched-bench built outside this repository
# (docs/benchmarks.md says how). With no MODEL, uses the default model plus same-shaped
# Q4_0, Q8_0 and F16 files made with `metro quantize` under $TMPDIR.
# Prints one line per run; summarise medians into docs/benchmarks.md.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PEER="${1:?usage: $0 LLAMA_CPP_BIN_DIR [MODEL...]}"
shift
METRO="$ROOT/build/bin/metro"
THREADS="${THREADS:-2}"
ROUNDS="${ROUNDS:-2}"
TMP="${TMPDIR:-/tmp}"
MODELS=("$@")
if [ ${#MODELS[@]} -eq 0 ]; then
  BASE="$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf"
  MODELS=("$BASE")
  for t in q4_0 q8_0 f16; do
    out="$TMP/smollm2-135m-$t.gguf"
    [ -f "$out" ] || "$METRO" quantize "$BASE" "$out" --type "$t"
    MODELS+=("$out")
  done
fi

for m in "${MODELS[@]}"; do
  name="$(basename "$m")"
  for round in $(seq "$ROUNDS"); do
    l=$("$PEER/llama-bench" -m "$m" -p 512 -n 128 -t "$THREADS" -r 3 -o json 2>/dev/null |
        python3 -c 'import json,sys; r=json.load(sys.stdin); print(" ".join("%s=%.1f" % ("pp" if x["n_prompt"] else "tg", x["avg_ts"]) for x in r))')
    echo "llama.cpp $name round $round: $l"
    j=$("$METRO" bench -m "$m" -p 512 -n 128 -t "$THREADS" -r 3 --json |
        python3 -c 'import json,sys; r=json.load(sys.stdin); f=r["roofline"]; print("pp=%.1f tg=%.1f tg_gbps=%.2f bw_frac=%.2f pp_gops=%.0f pp_peak_frac=%.2f int8_peak=%.0f" % (r["pp"], r["tg"], r["tg_gbps"], r["tg_bw_fraction"], f["pp_gops"], f["pp_peak_fraction"], f["int8_peak_gops"]))')
    echo "metro     $name round $round: $j"
  done
done

# Batched decode (the paged engine's reason to exist), default model only.
m="${MODELS[0]}"
for round in $(seq "$ROUNDS"); do
  echo "llama-batched-bench round $round:"
  "$PEER/llama-batched-bench" -m "$m" -c 8448 -b 2048 -ub 512 -npp 128 -ntg 128 -npl 1,4,16,32 \
      -t "$THREADS" 2>/dev/null | grep -E '^\|\s+[0-9]'
  echo "metro bench --batch round $round:"
  "$METRO" bench -m "$m" --batch 1,4,16,32 -p 128 -n 128 -r 1 -t "$THREADS"
done
