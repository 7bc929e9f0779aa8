#!/usr/bin/env bash
# hc mode (SPEC section 8, kernels/hc.cuh v3) on a GPU machine, in under 5 minutes once built:
#   1. the hc lab: ./dev/cuda/hc --all (v1, v2, v3: --check against the fp64 reference, twice,
#      bit-identical, with the trainer's edge paths; --bench at the 100M shape)
#   2. std and hc n=4 side by side at the 100M shape (B=16, T=2048, 15 steps, random tokens):
#      tokens/s and GPU memory by dev/bench_gpu.sh's method (RUNS="std hc4", no PyTorch, no
#      profile); the goals: hc >= 0.90x std's tokens/s, memory <= 1.30x std's
#   3. the GPU test: ./test_mhar built with its GPU checks (it has no per-mode filter, so all of
#      it: the CPU sections, then every GPU case, hc n=4, n=2 and C=512 n=4 among them, and the
#      trainer binaries' checks)
# Run from the repository root:  bash dev/cuda/hc_device_check.sh
#   OUT=DIR: each step's output is also written to DIR/hc_lab.txt, hc_bench.txt, hc_test.txt
#   (and hc_build.txt), and the summary to DIR/hc_summary.txt.
# Binaries that exist are used as they are (dev/cuda/hc, train_mhar_cu, train_mhar_cu_fp32,
# train_mhar, and test_mhar when it was built with the GPU checks); missing ones are built
# with make first (in parallel; a few minutes, outside the 5-minute budget of the steps).
# Exit status: 0 when every step passed (the speed and memory goals are reported, not enforced).
# Time limits: lab 100 s, bench 80 s, test 150 s (330 s in all; the CPU sections of the test
# take seconds, its GPU cases and trainer-binary checks the rest).
set -u
cd "$(dirname "$0")/../.."
[ -n "${OUT:-}" ] && mkdir -p "$OUT"
# runs "$@" with its output on the terminal and, with OUT, in $OUT/$1.txt; returns its status
step() {
    local name=$1
    shift
    if [ -n "${OUT:-}" ]; then "$@" 2>&1 | tee "$OUT/$name.txt"; return "${PIPESTATUS[0]}"; fi
    "$@" 2>&1
}
summary=()
note() { summary+=("$*"); echo "== $*"; }

# build what is missing (test_mhar counts as missing when it lacks the GPU checks)
need=()
[ -x dev/cuda/hc ] || need+=(dev/cuda/hc)
for b in train_mhar train_mhar_cu train_mhar_cu_fp32; do [ -x $b ] || need+=($b); done
if [ ! -x test_mhar ] || ! grep -qa MHAR_GPU_QUICK test_mhar; then rm -f test_mhar; need+=(test_mhar); fi
if [ ${#need[@]} -gt 0 ]; then
    t0=$(date +%s)
    step hc_build timeout 900 make -j8 WITH_GPU=yes "${need[@]}"
    rc=$?
    note "build ${need[*]}: exit $rc in $(( $(date +%s) - t0 )) s"
    [ $rc = 0 ] || { printf '%s\n' "${summary[@]}"; exit 1; }
fi
status=0

# 1. the lab
t0=$(date +%s)
step hc_lab timeout 100 ./dev/cuda/hc --all
rc=$?; [ $rc = 0 ] || status=1
note "lab ./dev/cuda/hc --all: exit $rc in $(( $(date +%s) - t0 )) s"

# 2. std against hc n=4 at 100m (dev/bench_gpu.sh: the trainer as built, 15 steps each)
t0=$(date +%s)
step hc_bench env RUNS="std hc4" TORCH=0 PROFILE=0 MAKE=0 STEPS=15 timeout 80 bash dev/bench_gpu.sh
rc=$?; [ $rc = 0 ] || status=1
note "bench std vs hc n=4 (100m, B=16, T=2048): exit $rc in $(( $(date +%s) - t0 )) s"

# 3. the GPU test
t0=$(date +%s)
step hc_test timeout 150 ./test_mhar
rc=$?; [ $rc = 0 ] || status=1
note "test_mhar (GPU build): exit $rc in $(( $(date +%s) - t0 )) s"

if [ -n "${OUT:-}" ]; then
    {
        printf '%s\n' "${summary[@]}"
        grep -h '^all checks\|FAIL\|DIFFERENT' "$OUT/hc_lab.txt"
        grep -h '^[fb]wd v[123] N=32768' "$OUT/hc_lab.txt"
        grep -h '^std \|^hc4 \|^hc n=4 against' "$OUT/hc_bench.txt"
        grep -h 'hc\|^FAIL\|passed,' "$OUT/hc_test.txt" | grep -h 'GPU\|^FAIL\|passed,'
    } >"$OUT/hc_summary.txt"
    echo; echo "summary ($OUT/hc_summary.txt):"; cat "$OUT/hc_summary.txt"
fi
exit $status
