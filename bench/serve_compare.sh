#!/usr/bin/env bash
# metro serve vs llama.cpp's llama-server on the same machine and model, driven by the same
# `metro bench-serve` commands, servers run one at a time, alternated (A B A B).
#
#   bench/serve_compare.sh LLAMA_CPP_BIN_DIR [OUT_DIR]
#
# Scenarios: 16 concurrent streams of 128-token prompts generating 64 tokens, and
# 512-token prompts sharing 448 tokens (4 system prompts x 8 users). llama-server gets 16
# slots (-np 16) and a 16 x 1024-token context so that it, too, decodes all 16 streams at once
# (its default of 4 slots leaves 12 waiting); both use 2 threads. Prints one summary line per
# run; the JSON of each run goes to OUT_DIR. METRO_ARGS adds flags to metro serve (e.g.
# "--admission off" to queue everything as llama-server does); SERVERS="metro" runs one side.
# METRO_BASE=/path/to/another/metro adds it as server "metro-base" (SERVERS="metro-base metro
# llama"), to measure a change against both its parent and the peer in one run.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PEER="${1:?usage: $0 LLAMA_CPP_BIN_DIR [OUT_DIR]}"
OUT="${2:-$(mktemp -d /tmp/metro-serve-compare.XXXX)}"
MODEL="${MODEL:-$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
METRO="$ROOT/build/bin/metro"
METRO_BASE="${METRO_BASE:-}"
THREADS="${THREADS:-2}"
ROUNDS="${ROUNDS:-1}"
PORT=18090
mkdir -p "$OUT"

wait_ready() {
  for _ in $(seq 600); do
    if curl -sf "http://127.0.0.1:$PORT/v1/models" >/dev/null 2>&1; then return 0; fi
    sleep 0.2
  done
  echo "server did not come up" >&2
  return 1
}

STARTS=0
start_server() {  # $1: metro | metro-base | llama
  # A fresh port each time: connections a previous server left behind (llama-server's are
  # not SO_REUSEADDR) can keep its port from being bound again for a while.
  PORT=$((18090 + STARTS % 100))
  STARTS=$((STARTS + 1))
  if [ "$1" = metro ]; then
    "$METRO" serve -m "$MODEL" --port "$PORT" -t "$THREADS" ${METRO_ARGS:-} >"$OUT/server-$1.log" 2>&1 &
  elif [ "$1" = metro-base ]; then
    "${METRO_BASE:?METRO_BASE: the other metro binary}" serve -m "$MODEL" --port "$PORT" -t "$THREADS" \
      ${METRO_ARGS:-} >"$OUT/server-$1.log" 2>&1 &
  else
    "$PEER/llama-server" -m "$MODEL" --port "$PORT" -t "$THREADS" -np 16 -c 16384 >"$OUT/server-$1.log" 2>&1 &
  fi
  SERVER_PID=$!
  wait_ready
}

stop_server() {
  kill -INT "$SERVER_PID" 2>/dev/null || true
  wait "$SERVER_PID" 2>/dev/null || true
}

summary() {  # $1: json
  python3 - "$1" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))["runs"][0]
g = r["overall"]
q = lambda k, p: (g[k] or {}).get(p) or float("nan")
cached = g["input_tokens"].get("cached") or 0
total_in = g["input_tokens"]["total"] or 1
print(f"ok {g['ok']}/{g['requests']} in {r['duration_s']:.1f} s | out {g['throughput']['output_tokens_per_s']:.1f} tok/s | "
      f"TTFT p50 {q('ttft_s','p50'):.3f} p99 {q('ttft_s','p99'):.3f} s | TPOT p50 {q('tpot_s','p50'):.4f} "
      f"p99 {q('tpot_s','p99'):.4f} s | E2E p50 {q('e2e_s','p50'):.2f} s | cached {cached / total_in:.0%}")
EOF
}

S1=(--num-requests 32 --max-concurrency 16 --input-len 128 --output-len 64 --seed 1)
S2=(--dataset shared-prefix --num-requests 32 --max-concurrency 16 --input-len 512 --prefix-len 448
    --num-prefixes 4 --output-len 64 --seed 1)

for round in $(seq "$ROUNDS"); do
  for server in ${SERVERS:-metro llama}; do
    for s in 1 2; do
      start_server "$server"
      if [ "$s" = 1 ]; then args=("${S1[@]}"); else args=("${S2[@]}"); fi
      json="$OUT/$server-s$s-r$round.json"
      "$METRO" bench-serve --url "http://127.0.0.1:$PORT" --quiet --timeout 1800 "${args[@]}" --json "$json" >/dev/null
      echo "$server scenario $s round $round: $(summary "$json")"
      stop_server
    done
  done
done
echo "JSON in $OUT"
