#!/usr/bin/env bash
# The precision-tier flood: one server per policy (auto, high only, low only) over the same
# two tiers, each sent the same Poisson flood of completions (a realtime + standard mix) by
# metro bench-serve; prints goodput and TTFT p99 per class.
#   bench/tiers_flood.sh [RATE] [REQUESTS]
# Env: METRO (build/bin/metro), MODEL (the default model), TIERS (high=q8_0: the high tier
# derived from the file, the file itself the low tier), THREADS (2), OUT (/tmp/tiers_flood),
# POLICIES ("auto high low"), EXTRA (more serve flags, e.g. "--tier-pin-realtime off").
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
METRO="${METRO:-$ROOT/build/bin/metro}"
MODEL="${MODEL:-$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
TIERS="${TIERS:-high=q8_0}"
THREADS="${THREADS:-2}"
OUT="${OUT:-/tmp/tiers_flood}"
RATE="${1:-6.5}"
N="${2:-200}"
POLICIES="${POLICIES:-auto high low}"
EXTRA="${EXTRA:-}"
PORT=18299
mkdir -p "$OUT"
for policy in $POLICIES; do
  # A server left on the port would answer in place of this one (and with a warm prefix cache).
  if curl -s -o /dev/null "http://127.0.0.1:$PORT/ready"; then
    echo "tiers_flood: port $PORT is already in use" >&2
    exit 1
  fi
  # shellcheck disable=SC2086
  "$METRO" serve -m "$MODEL" --port "$PORT" -t "$THREADS" --tiers "$TIERS" --tier-policy "$policy" $EXTRA \
    > "$OUT/serve-$policy.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 100); do
    curl -sf "http://127.0.0.1:$PORT/ready" > /dev/null 2>&1 && break
    sleep 0.2
  done
  kill -0 "$pid" 2> /dev/null || { echo "tiers_flood: metro serve exited:" >&2; cat "$OUT/serve-$policy.log" >&2; exit 1; }
  "$METRO" bench-serve --url "http://127.0.0.1:$PORT" --rate "$RATE" --num-requests "$N" --input-len 128 \
    --output-len 64 --classes realtime:0.2,standard:0.8 --slo 'ttft=2,tpot=0.2;realtime:ttft=0.5,tpot=0.1' \
    --seed 7 --quiet --json "$OUT/$policy.json" > "$OUT/$policy.txt"
  curl -s "http://127.0.0.1:$PORT/metrics" | grep -E '^metro_precision_(switches_total|tier_tokens_total|shadow_kl|rollbacks)' \
    > "$OUT/$policy.metrics" || true
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  echo "== --tier-policy $policy"
  grep -E "goodput|request throughput|output token throughput" "$OUT/$policy.txt" | head -8
  grep -A4 "TTFT" "$OUT/$policy.txt" | grep -E "TTFT" | head -4
  cat "$OUT/$policy.metrics"
done
