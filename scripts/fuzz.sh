#!/usr/bin/env bash
# Runs every libFuzzer binary in BUILD_DIR/bin for a share of SECONDS (at least 10 s each),
# starting from the committed seed corpus in fuzz/corpus/<name>/. New inputs go to a
# scratch copy so the committed corpus only changes by hand. Exits non-zero on any crash.
set -euo pipefail
BUILD_DIR="${1:-build-fuzz}"
SECONDS_TOTAL="${2:-60}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
mapfile -t TARGETS < <(find "$BUILD_DIR/bin" -maxdepth 1 -type f -name '*_fuzz' | sort)
[ ${#TARGETS[@]} -gt 0 ] || { echo "fuzz: no targets in $BUILD_DIR/bin" >&2; exit 1; }
PER=$(( SECONDS_TOTAL / ${#TARGETS[@]} ))
[ "$PER" -ge 10 ] || PER=10
mkdir -p "$BUILD_DIR/artifacts"
for t in "${TARGETS[@]}"; do
  name="$(basename "$t")"
  seeds="$ROOT/fuzz/corpus/${name%_fuzz}"
  work="$BUILD_DIR/corpus/$name"
  mkdir -p "$work"
  [ -d "$seeds" ] && cp -n "$seeds"/* "$work"/ 2>/dev/null || true
  dict=()
  [ -f "$ROOT/fuzz/${name%_fuzz}.dict" ] && dict=(-dict="$ROOT/fuzz/${name%_fuzz}.dict")
  echo "fuzz: $name for ${PER}s"
  "$t" "$work" "${dict[@]}" -max_total_time="$PER" -max_len=65536 -rss_limit_mb=2048 \
       -timeout=10 -artifact_prefix="$BUILD_DIR/artifacts/${name}-" -print_final_stats=1 \
       2>"$BUILD_DIR/$name.log" || { tail -n 40 "$BUILD_DIR/$name.log"; exit 1; }
  grep -E '^(stat::number_of_executed_units|stat::new_units_added|Done)' "$BUILD_DIR/$name.log" || true
done
