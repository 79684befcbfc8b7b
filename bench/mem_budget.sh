#!/bin/bash
# `metro bench --mem-budget` on a mixture-of-experts file beside llama-bench
# (docs/benchmarks.md, "A memory budget"): first with the machine's memory free (the page
# cache holds the whole file), then each in a memory cgroup capped below the file's size,
# where what is not resident is read from the disk. The cgroup part needs root and cgroup
# v1 or v2 memory control; the page cache is dropped before each capped run.
#
#   bench/mem_budget.sh build/bin/metro /tmp/moe-bench-q4_0.gguf PATH/TO/llama-bench
set -u
METRO=$1 MODEL=$2 LLAMA_BENCH=$3
ARGS=(-p 128 -n 64 -r 3 -t 2)
COLD_DIR=${COLD_DIR:-/var/tmp}

metro() { "$METRO" bench -m "$MODEL" "${ARGS[@]}" "$@" 2>&1 | grep -E "^pp|^tg|memory budget|metro bench:"; }
llama() { "$LLAMA_BENCH" -m "$MODEL" "${ARGS[@]}" "$@" 2>&1 | grep -E "pp128|tg64|error"; }

# Runs a command in a fresh memory cgroup capped at $1 MiB; prints its exit code and peak.
capped() {
  local mib=$1; shift
  local cg
  if [ -d /sys/fs/cgroup/memory ]; then
    cg=/sys/fs/cgroup/memory/metro_bench_$$
    mkdir -p "$cg" && echo $((mib << 20)) > "$cg/memory.limit_in_bytes"
  else
    cg=/sys/fs/cgroup/metro_bench_$$
    mkdir -p "$cg" && echo $((mib << 20)) > "$cg/memory.max"
  fi
  sync; echo 1 > /proc/sys/vm/drop_caches
  bash -c 'echo $$ > "$0/cgroup.procs"; shift; exec "$@"' "$cg" _ "$@"
  local rc=$?
  local peak
  peak=$(cat "$cg/memory.max_usage_in_bytes" 2>/dev/null || cat "$cg/memory.peak" 2>/dev/null || echo 0)
  echo "exit $rc, peak $((peak >> 20)) MiB of $mib"
  rmdir "$cg" 2>/dev/null
}

echo "## memory free: the page cache holds the file"
echo "# metro, no budget"; metro
for b in 256MiB 128MiB 64MiB; do echo "# metro --mem-budget $b"; metro --mem-budget $b --cold-dir "$COLD_DIR"; done
echo "# metro --mem-budget 256MiB --cold-uncached"; metro --mem-budget 256MiB --cold-dir "$COLD_DIR" --cold-uncached
echo "# llama-bench"; llama

echo "## capped by a memory cgroup"
for lim in 1024 512 384; do
  echo "# cap $lim MiB: metro, no budget"; capped $lim bash -c "$(declare -f metro); METRO=$METRO MODEL=$MODEL; ARGS=(${ARGS[*]}); metro"
  b=$((lim - 160))
  echo "# cap $lim MiB: metro --mem-budget ${b}MiB"
  capped $lim bash -c "$(declare -f metro); METRO=$METRO MODEL=$MODEL; ARGS=(${ARGS[*]}); metro --mem-budget ${b}MiB --cold-dir $COLD_DIR"
  echo "# cap $lim MiB: llama-bench"; capped $lim bash -c "$(declare -f llama); LLAMA_BENCH=$LLAMA_BENCH MODEL=$MODEL; ARGS=(${ARGS[*]}); llama"
  echo "# cap $lim MiB: llama-bench --repack 0"
  capped $lim bash -c "$(declare -f llama); LLAMA_BENCH=$LLAMA_BENCH MODEL=$MODEL; ARGS=(${ARGS[*]}); llama --repack 0"
done
