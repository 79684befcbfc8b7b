#!/usr/bin/env bash
# Checks the CUDA backend on a machine with an NVIDIA GPU, with binaries built elsewhere
# (docs/cuda.md says how): the device, the per-op harness on the CUDA backend op by op,
# the GPU tests (greedy and batched comparisons with the CPU backend), and the benchmarks.
#
#   scripts/gpu_check.sh OUT_DIR [BUILD_DIR]      (BUILD_DIR defaults to build-cuda)
#   MODEL=path/to/model.gguf                      (default models/SmolLM2-135M-Instruct.Q4_1.gguf)
#
# Needs no compiler, cmake or libraries there when BUILD_DIR/bin holds metro and
# metro_tests, or when BUILD_DIR/gpu holds what scripts/gpu_bundle.sh packed (the binaries,
# and a model used when MODEL is unset); builds them only when neither is there. Tests
# find the source tree, binaries and model through METRO_SOURCE_DIR, METRO_BIN_DIR and
# METRO_MODEL, which this script sets. Writes at most 8 files to OUT_DIR:
# env.log, tests.log, tests.xml, bench.log, bench_cuda.json, bench_batch.json, bench_cpu.json,
# summary.txt. The A/B benchmarks without CUDA graphs (METRO_CUDA_GRAPHS=0) and a --profile
# run (decode time per op kind) go to bench.log and the summary only. Every step has a time
# limit; steps still to come are skipped once the whole run nears BUDGET_S seconds
# (default 420), so it ends well within 8 minutes.
set -u

OUT=${1:?usage: scripts/gpu_check.sh OUT_DIR [BUILD_DIR]}
BUILD=${2:-build-cuda}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 2
if [[ -z ${MODEL:-} && ! -f models/SmolLM2-135M-Instruct.Q4_1.gguf && -f $BUILD/gpu/model.gguf ]]; then
  MODEL=$BUILD/gpu/model.gguf
fi
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
BUDGET_S=${BUDGET_S:-420}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
START=$(date +%s)
SUMMARY=()

elapsed() { echo $(( $(date +%s) - START )); }
note() { echo "[$(elapsed)s] $*" | tee -a "$OUT/summary.txt"; }
row() { SUMMARY+=("$(printf '%-34s %-8s %s' "$1" "$2" "$3")"); }
# time_left LIMIT: the step's limit, cut to what the budget leaves; 0 when nothing is left.
time_left() {
  local left=$(( BUDGET_S - $(elapsed) ))
  if (( left < 15 )); then echo 0; elif (( left < $1 )); then echo "$left"; else echo "$1"; fi
}

: >"$OUT/summary.txt"
note "gpu_check: build $BUILD, model $MODEL, out $OUT"

# ---- binaries ---------------------------------------------------------------------------
if [[ (! -x $BUILD/bin/metro || ! -x $BUILD/bin/metro_tests) && -f $BUILD/gpu/bin.tar.xz ]]; then
  mkdir -p "$BUILD"
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$BUILD/gpu/bin.tar.xz" "$BUILD" ||
    tar -C "$BUILD" -xJf "$BUILD/gpu/bin.tar.xz"
  note "unpacked $BUILD/gpu/bin.tar.xz"
fi
if [[ ! -x $BUILD/bin/metro || ! -x $BUILD/bin/metro_tests ]]; then
  note "binaries missing in $BUILD/bin: building (needs cmake, nvcc and metro's dependencies here)"
  { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMETRO_CUDA=ON -DMETRO_BUILD_BENCH=OFF &&
    cmake --build "$BUILD" --target metro_cli metro_tests -j "$(nproc)"; } >"$OUT/env.log" 2>&1 ||
    { note "build failed: see env.log"; row build FAIL "see env.log"; }
fi
METRO=$BUILD/bin/metro
TESTS=$BUILD/bin/metro_tests
export METRO_SOURCE_DIR=$ROOT METRO_BIN_DIR=$ROOT/$BUILD/bin METRO_MODEL=$ROOT/$MODEL
[[ $BUILD == /* ]] && METRO_BIN_DIR=$BUILD/bin
[[ $MODEL == /* ]] && METRO_MODEL=$MODEL

# ---- the device and the binaries ----------------------------------------------------------
{
  echo "== nvidia-smi"; timeout 30 nvidia-smi 2>&1
  echo "== nvidia-smi -q (clocks, memory)"; timeout 30 nvidia-smi -q -d CLOCK,MEMORY 2>&1 | head -60
  echo "== uname, glibc"; uname -a; ldd --version 2>&1 | head -1
  echo "== ldd $METRO"; ldd "$METRO" 2>&1
  echo "== ldd $TESTS"; ldd "$TESTS" 2>&1
  echo "== metro inspect --device cuda"
  if [[ -f $MODEL ]]; then timeout 60 "$METRO" inspect "$MODEL" --device cuda 2>&1; else echo "model $MODEL absent"; fi
} >>"$OUT/env.log" 2>&1
if timeout 20 nvidia-smi -L >/dev/null 2>&1; then row nvidia-smi ok "$(nvidia-smi -L 2>/dev/null | head -1)"; else row nvidia-smi FAIL "no GPU listed"; fi
if "$TESTS" --gtest_list_tests --gtest_filter='Available/BackendOps.*' 2>/dev/null | grep -q cuda; then
  CUDA_NAME=$("$TESTS" --gtest_list_tests --gtest_filter='Available/BackendOps.*' | grep -o 'cuda_sm[0-9]*' | head -1)
  row "cuda backend listed" ok "$CUDA_NAME"
else
  CUDA_NAME=""
  row "cuda backend listed" FAIL "metro_tests lists no cuda backend (driver? see env.log)"
fi

# ---- the per-op harness on the CUDA backend, one op per process ---------------------------
# METRO_CUDA_SYNC=1 synchronises after every op, so a kernel fault names its op.
: >"$OUT/tests.log"
if [[ -n $CUDA_NAME ]]; then
  for op in Embed RopeAngles RmsNorm Project AddBias Rope KvStore Attention Add Swiglu AllReduce \
            ProjectSlicedOverRanksThenAllReduced; do
    lim=$(time_left 60)
    if (( lim == 0 )); then row "harness $op" SKIP "out of time"; continue; fi
    echo "==== harness $op on $CUDA_NAME" >>"$OUT/tests.log"
    METRO_CUDA_SYNC=1 timeout "$lim" "$TESTS" --gtest_filter="Available/BackendOps.$op/$CUDA_NAME" \
      >>"$OUT/tests.log" 2>&1
    rc=$?
    case $rc in
      0) row "harness $op" PASS "" ;;
      124) row "harness $op" TIMEOUT "${lim}s" ;;
      1) row "harness $op" FAIL "see tests.log" ;;
      *) row "harness $op" CRASH "exit $rc, see tests.log" ;;
    esac
  done
fi

# ---- every backend's harness, the CUDA tests, the selection tests: one run, with XML -------
lim=$(time_left 200)
if (( lim > 0 )); then
  echo "==== BackendOps (every backend), Cuda, CudaFormats, BackendRegistry" >>"$OUT/tests.log"
  timeout "$lim" "$TESTS" --gtest_filter='*BackendOps*:Cuda.*:CudaFormats.*:BackendRegistry.*' \
    --gtest_output="xml:$OUT/tests.xml" >>"$OUT/tests.log" 2>&1
  rc=$?
  pass=$(grep -c '^\[       OK \]' "$OUT/tests.log" || true)
  fails=$(grep '^\[  FAILED  \] [A-Za-z]' "$OUT/tests.log" | grep -v 'listed below' | sort -u | wc -l)
  skipped=$(grep -c '^\[  SKIPPED \]' "$OUT/tests.log" || true)
  row "gtest (all backends + cuda)" "$([[ $rc == 0 ]] && echo PASS || echo "rc=$rc")" \
    "ok lines $pass, failed $fails, skipped $skipped"
  grep -E '^cuda (greedy|batch|graphs)' "$OUT/tests.log" | sed 's/^/  /' >>"$OUT/summary.txt"
else
  row "gtest (all backends + cuda)" SKIP "out of time"
fi

# ---- benchmarks -------------------------------------------------------------------------
HBM_GBPS=${HBM_GBPS:-4300}  # device-to-device copy bandwidth measured on this H200 (docs/cuda.md)
if [[ ! -f $MODEL ]]; then
  note "model $MODEL absent: benchmarks skipped"
  row bench SKIP "no model"
elif [[ -z $CUDA_NAME ]]; then
  row bench SKIP "no cuda backend"
else
  : >"$OUT/bench.log"
  # The A/B runs' JSON lies outside OUT (OUT keeps at most 8 files); bench.log has it too.
  AB=$(mktemp -d)
  bench() {  # NAME LIMIT JSON_PATH ARGS...
    local name=$1 limit=$2 json=$3
    shift 3
    local lim
    lim=$(time_left "$limit")
    if (( lim == 0 )); then row "$name" SKIP "out of time"; return; fi
    echo "==== ${METRO_CUDA_GRAPHS:+METRO_CUDA_GRAPHS=$METRO_CUDA_GRAPHS }metro bench $*" >>"$OUT/bench.log"
    timeout "$lim" "$METRO" bench -m "$MODEL" "$@" --json >"$json" 2>>"$OUT/bench.log"
    local rc=$?
    cat "$json" >>"$OUT/bench.log"
    if [[ $rc == 0 ]]; then row "$name" ok "${json##*/}"; else row "$name" "rc=$rc" "see bench.log"; fi
  }
  bench "bench cuda pp512 tg128" 120 "$OUT/bench_cuda.json" --device cuda -p 512 -n 128 -r 3
  bench "bench cuda batch 16,64,256" 150 "$OUT/bench_batch.json" --device cuda --batch 16,64,256 -p 128 -n 128 -r 1
  export METRO_CUDA_GRAPHS=0
  bench "bench cuda tg128, no graphs" 60 "$AB/cuda.json" --device cuda -p 512 -n 128 -r 1
  bench "bench cuda batch, no graphs" 90 "$AB/batch.json" --device cuda --batch 16,64,256 -p 128 -n 128 -r 1
  unset METRO_CUDA_GRAPHS
  # Where a decode step's time goes, per op kind (events around every op: slower steps).
  bench "bench cuda decode profile" 60 "$AB/profile.json" --device cuda --batch 1,16,256 -p 128 -n 32 -r 1 --profile
  bench "bench cpu pp512 tg128 (reference)" 60 "$OUT/bench_cpu.json" -p 512 -n 128 -r 1
  python3 - "$OUT" "$HBM_GBPS" "$AB" >>"$OUT/summary.txt" 2>&1 <<'EOF'
import json, os, sys
out, hbm, ab = sys.argv[1], float(sys.argv[2]), sys.argv[3]
def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except Exception as e:  # a run that failed or was skipped
        print(f"  {os.path.basename(path)}: not readable ({e})")
        return None
c, b, cpu = (load(os.path.join(out, n)) for n in ("bench_cuda.json", "bench_batch.json", "bench_cpu.json"))
c0, b0, prof = (load(os.path.join(ab, n)) for n in ("cuda.json", "batch.json", "profile.json"))
for label, r in (("graphs", c), ("no graphs", c0)):
    if r:
        print(f"  cuda ({r.get('backend')}, {label}): pp512 {r['pp']:.1f} tok/s, tg128 {r['tg']:.1f} tok/s "
              f"({1e3 / r['tg']:.3f} ms/token), weights {r['weight_bytes_per_token'] / 2**20:.1f} MiB per step")
if cpu:
    print(f"  cpu  ({cpu.get('backend')}): pp512 {cpu['pp']:.1f} tok/s, tg128 {cpu['tg']:.1f} tok/s")
for label, bb in (("graphs", b), ("no graphs", b0)):
    if not bb:
        continue
    bpt = bb["weight_bytes_per_token"]
    for r in bb["batch"]:
        gbps = bpt * r["decode_tps"] / r["n_seq"] / 1e9
        print(f"  cuda batch {r['n_seq']:4d} ({label}): prefill {r['prefill_tps']:10.1f} tok/s, "
              f"decode {r['decode_tps']:10.1f} tok/s, step {1e3 * r['n_seq'] / r['decode_tps']:.2f} ms, "
              f"weights {gbps:.1f} GB/s = {100 * gbps / hbm:.2f}% of {hbm:.0f} GB/s HBM")
if prof:
    for r in prof["batch"]:
        ms = r.get("decode_profile_ms", {})
        parts = ", ".join(f"{k} {v:.3f}" for k, v in sorted(ms.items(), key=lambda kv: -kv[1]))
        print(f"  cuda profile {r['n_seq']:4d} seqs, ms per decode step: {parts}")
EOF
  rm -rf "$AB"
fi

# ---- summary ----------------------------------------------------------------------------
{
  echo
  echo "==== gpu_check summary ($(elapsed)s)"
  printf '%s\n' "${SUMMARY[@]}"
} | tee -a "$OUT/summary.txt"
echo "---- details"
sed -n '/^  cuda\|^  cpu/p' "$OUT/summary.txt"
