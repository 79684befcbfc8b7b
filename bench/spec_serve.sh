#!/usr/bin/env bash
# metro serve with --spec off and with speculation under the same `metro bench-serve` load
# at several concurrency levels, servers run one at a time, alternated per level.
#
#   bench/spec_serve.sh [OUT_DIR]
#   SPECS="off self" bench/spec_serve.sh          # the modes compared (default: off ngram)
#   SPECS="off draft" DRAFT=small.gguf MODEL=big.gguf bench/spec_serve.sh
#
# The load: bench/spec/serve_mixed.jsonl (half input-grounded chats: copy a paragraph,
# edit a function; half open chats), max_tokens 96, LEVELS concurrent streams
# (default 1 4 16 32 64), 4 x level requests (at least 16). Prints one line per run:
# level, speculation, output tokens/s, TPOT p50, TTFT p50, drafts accepted/proposed.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${1:-$(mktemp -d /tmp/metro-spec-serve.XXXX)}"
MODEL="${MODEL:-$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
METRO="$ROOT/build/bin/metro"
THREADS="${THREADS:-2}"
LEVELS="${LEVELS:-1 4 16 32 64}"
SPECS="${SPECS:-off ngram}"
DRAFT="${DRAFT:-}"
DATASET="$ROOT/bench/spec/serve_mixed.jsonl"
PORT=18190
mkdir -p "$OUT"

wait_ready() {
  for _ in $(seq 600); do
    if curl -sf "http://127.0.0.1:$PORT/ready" >/dev/null 2>&1; then return 0; fi
    sleep 0.2
  done
  echo "server did not come up" >&2
  return 1
}

metric() {  # $1: series name prefix; sums every sample of it
  curl -sf "http://127.0.0.1:$PORT/metrics" | awk -v n="$1" 'index($1, n) == 1 { s += $2 } END { printf "%d", s }'
}

for level in $LEVELS; do
  for spec in $SPECS; do
    PORT=$((PORT + 1))
    extra=()
    [ "$spec" = draft ] && extra=(--spec-draft "${DRAFT:?--spec draft needs DRAFT=FILE}")
    "$METRO" serve -m "$MODEL" --port "$PORT" -t "$THREADS" --spec "$spec" "${extra[@]}" --max-seqs 64 \
      --admission off >"$OUT/server-$level-$spec.log" 2>&1 &
    pid=$!
    wait_ready
    n=$((4 * level))
    [ "$n" -ge 16 ] || n=16
    "$METRO" bench-serve --url "http://127.0.0.1:$PORT" --endpoint chat --dataset "$DATASET" \
      --num-requests "$n" --max-concurrency "$level" --quiet --json "$OUT/run-$level-$spec.json" >/dev/null
    proposed=$(metric metro_spec_proposed_tokens_total)
    accepted=$(metric metro_spec_accepted_tokens_total)
    kill "$pid"
    wait "$pid" || true
    python3 - "$OUT/run-$level-$spec.json" "$level" "$spec" "$accepted" "$proposed" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
run = j["runs"][0] if "runs" in j else j
g = run["overall"]
print(f"level {sys.argv[2]:>3} spec {sys.argv[3]:<5} out {g['throughput']['output_tokens_per_s']:7.1f} tok/s"
      f"  TPOT p50 {g['tpot_s']['p50'] * 1e3:6.1f} ms  TTFT p50 {g['ttft_s']['p50']:6.2f} s"
      f"  ok {g['ok']}/{g['requests']}  drafts {sys.argv[4]}/{sys.argv[5]}", flush=True)
EOF
  done
done
echo "runs in $OUT"
