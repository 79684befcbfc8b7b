#!/usr/bin/env bash
# Long fuzzing: every libFuzzer binary in BUILD_DIR/bin at once, each for SECONDS of wall
# time with JOBS worker processes (libFuzzer's fork mode), from the corpus `make fuzz` keeps
# in BUILD_DIR/corpus/<target> (seeded from fuzz/corpus/<target>). Prints, per target, the
# executions, coverage and crashes; exits non-zero if any target found a crash, a leak or a
# timeout (the inputs are under BUILD_DIR/artifacts).
#
#   scripts/fuzz_long.sh BUILD_DIR SECONDS [JOBS]      e.g. scripts/fuzz_long.sh build-fuzz 3600 1
set -euo pipefail
BUILD_DIR="${1:?usage: $0 BUILD_DIR SECONDS [JOBS]}"
SECONDS_EACH="${2:?usage: $0 BUILD_DIR SECONDS [JOBS]}"
JOBS="${3:-1}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
mapfile -t TARGETS < <(find "$BUILD_DIR/bin" -maxdepth 1 -type f -name '*_fuzz' | sort)
[ ${#TARGETS[@]} -gt 0 ] || { echo "fuzz_long: no targets in $BUILD_DIR/bin" >&2; exit 1; }
mkdir -p "$BUILD_DIR/artifacts"
pids=()
for t in "${TARGETS[@]}"; do
  name="$(basename "$t")"
  work="$BUILD_DIR/corpus/$name"
  mkdir -p "$work"
  seeds="$ROOT/fuzz/corpus/${name%_fuzz}"
  [ -d "$seeds" ] && cp -n "$seeds"/* "$work"/ 2>/dev/null || true
  dict=()
  [ -f "$ROOT/fuzz/${name%_fuzz}.dict" ] && dict=(-dict="$ROOT/fuzz/${name%_fuzz}.dict")
  "$t" "$work" "${dict[@]}" -fork="$JOBS" -max_total_time="$SECONDS_EACH" -max_len=65536 -rss_limit_mb=2048 \
       -timeout=10 -artifact_prefix="$BUILD_DIR/artifacts/${name}-" -print_final_stats=1 \
       >"$BUILD_DIR/$name.long.log" 2>&1 &
  pids+=($!)
done
status=0
for i in "${!pids[@]}"; do
  name="$(basename "${TARGETS[$i]}")"
  rc=0
  wait "${pids[$i]}" || rc=$?
  # Fork mode's progress lines start with '#<total executions>:'; the last one is the total.
  last="$(grep -E '^#[0-9]+:' "$BUILD_DIR/$name.long.log" | tail -n 1 || true)"
  [ -n "$last" ] || last="$(grep -E '^#[0-9]+' "$BUILD_DIR/$name.long.log" | tail -n 1 || true)"
  crashes="$(grep -cE 'ERROR: libFuzzer|ERROR: AddressSanitizer|SUMMARY: ' "$BUILD_DIR/$name.long.log" || true)"
  echo "fuzz_long: $name rc=$rc ${last:-no progress line} crashes=$crashes"
  if [ "$rc" -ne 0 ] || [ "$crashes" -ne 0 ]; then
    status=1
    tail -n 30 "$BUILD_DIR/$name.long.log"
  fi
done
exit $status
