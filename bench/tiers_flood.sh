#!/usr/bin/env bash
# The precision-tier flood: one server per policy (auto, high only, low only) over the same
# two tiers, each sent the same Poisson flood of completions (a realtime + standard mix) by
# metro bench-serve; prints goodput and TTFT p99 per class.
#   bench/tiers_flood.sh [RATE] [REQUESTS]
# Env: METRO (build/bin/metro), MODEL (the default model), TIERS (high=q8_0: the high tier
# derived from the file, the file itself the low tier), THREADS (2), OUT (/tmp/tiers_flood),
# POLICIES ("auto high low"), EXTRA (more serve flags, e.g. "--tier-pin-realtime off"),
# PHASES (instead of RATE and REQUESTS: "RATE:N RATE:N ..." sent one after another to the same
# server, e.g. a peak then a quiet spell: "6.5:120 1:60"; each phase's report is
# OUT/POLICY-pK.txt). Each run ends with the share of tokens the low tier computed and the
# KL of what was served, estimated as that share x the shadow scorer's mean KL (tokens the
# high tier computed are the reference: KL 0).
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
PHASES="${PHASES:-$RATE:$N}"
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
  k=0
  for phase in $PHASES; do
    k=$((k + 1))
    name="$policy"
    [ "$PHASES" = "$RATE:$N" ] || name="$policy-p$k"
    "$METRO" bench-serve --url "http://127.0.0.1:$PORT" --rate "${phase%%:*}" --num-requests "${phase##*:}" \
      --input-len 128 --output-len 64 --classes realtime:0.2,standard:0.8 \
      --slo 'ttft=2,tpot=0.2;realtime:ttft=0.5,tpot=0.1' --seed $((7 + k - 1)) --quiet --json "$OUT/$name.json" \
      > "$OUT/$name.txt"
    echo "== --tier-policy $policy, phase $k: ${phase%%:*} req/s x ${phase##*:}"
    grep -E "goodput|request throughput|output token throughput" "$OUT/$name.txt" | head -8
    grep -A4 "TTFT" "$OUT/$name.txt" | grep -E "TTFT" | head -4
  done
  # Let the shadow scorer finish what it queued before reading its mean.
  sleep 5
  curl -s "http://127.0.0.1:$PORT/metrics" | grep -E '^metro_precision_(switches_total|tier_tokens_total|shadow_kl|shadow_scored|rollbacks)' \
    > "$OUT/$policy.metrics" || true
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  cat "$OUT/$policy.metrics"
  awk '/tier_tokens_total.*tier="high"/ {h = $NF} /tier_tokens_total.*tier="low"/ {l = $NF}
       /^metro_precision_shadow_kl/ {kl = $NF}
       END { if (h + l > 0) printf "low-tier share of tokens %.3f, shadow KL %.4f, KL of what was served %.4f\n",
                                  l / (h + l), kl, kl * l / (h + l) }' "$OUT/$policy.metrics"
done
