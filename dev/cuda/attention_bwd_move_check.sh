#!/usr/bin/env bash
# One device call (nvidia-h200, under 5 minutes) for the move of lab v6.1, the wgmma backward, into the
# trainer (kernels/attention.cuh). Prebuilt binaries only, no builds here; the caller brings:
#   dev/cuda/attention            nvcc -O3 -std=c++17 -arch=sm_90a -o dev/cuda/attention dev/cuda/attention.cu
#   ./train_mhar_cu ./train_mhar_cu_fp32 ./test_mhar ./train_mhar
#                                 make NATIVE= NCCL_HOME= WITH_GPU=yes train_mhar train_mhar_cu train_mhar_cu_fp32 test_mhar
#                                 (NATIVE= : no -march=native in the C binaries, which run on this machine's CPU)
#   OLD_TRAINER                   a train_mhar_cu built before the move (v2's mma.sync backward), for the A/B
# Together they exceed what a device call carries (64 MiB); gzip halves them: BINS=file.tar.gz makes this
# script unpack such a bundle (paths relative to the repository root) before anything else.
# usage: bash dev/cuda/attention_bwd_move_check.sh OLD_TRAINER       (OUT=dir, default runs/attn_bwd_move;
#        BUDGET=seconds for all steps, default 280: a step that would start past it is skipped with a line;
#        BINS=bundle.tar.gz)
# Steps, in order of importance; each under timeout, each keeps going after a failure:
#   1. lab: --cpu-selftest (v6 emulation incl. variant 1 at T = 150); --version 6 --variant 1 --check (12
#      shapes incl. the tails T = 200, 100 at HD 64 and T = 200, 7 at HD 128; CPU fp64 reference, v2's
#      backward on the same inputs, v1's at tails; repeats bit-identical); --bench-list 2,6.1 at
#      16,2048,8,4,64 and 16,1024,16,8,128 (backward only, 2 passes)
#   2. the full ./test_mhar (bf16 flash configs HD 64 and 128 at T = 150 and 256, the layout configs at
#      T = 64, causality at the 100m shape, the trainer binaries)
#   3. A/B: OLD_TRAINER against ./train_mhar_cu, 100m, B=16, T=2048, -r std and -r mhar -H 8
#      (dev/ab_gpu.sh, ROUNDS=2, STEPS=12, no profile)
#   4. compute-sanitizer memcheck: the lab's v6.1 --check at two tail shapes, and MHAR_GPU_QUICK=1 ./test_mhar
# Logs in $OUT, five files (what a device call brings back is at most 8): lab.txt,
# test_mhar_full.txt, ab_100m.txt, memcheck.txt and summary.txt (printed at the end).
set -u
cd "$(dirname "$0")/../.."
[ $# -ge 1 ] || { echo "usage: bash dev/cuda/attention_bwd_move_check.sh OLD_TRAINER" >&2; exit 2; }
out=${OUT:-runs/attn_bwd_move}
budget=${BUDGET:-280}
lab=dev/cuda/attention
mkdir -p "$out"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
rm -f "$out"/{lab,test_mhar_full,ab_100m,memcheck}.txt
: >"$out/summary.txt"
summary() { echo "$*" >>"$out/summary.txt"; }
t_start=$(date +%s)
summary "device: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1)"
if [ -n "${BINS:-}" ]; then
    if tar -xzf "$BINS"; then summary "unpacked $BINS: $(tar -tzf "$BINS" | tr '\n' ' ')"; else summary "BINS: cannot unpack $BINS"; fi
fi
old=$1   # as given: relative paths keep the logs free of the machine's folders
for f in "$lab" ./train_mhar_cu ./train_mhar_cu_fp32 ./test_mhar ./train_mhar "$old"; do
    [ -x "$f" ] || summary "MISSING: $f (prebuilt binaries only: see this script's header)"
done

run() {   # run LOG NAME SECONDS CMD...: output appended to $out/LOG.txt; one summary line (exit, time, last line)
    local log=$1 name=$2 cap=$3 t0 rc left
    shift 3
    : >"$tmp/$name.txt"
    left=$(( budget - ($(date +%s) - t_start) ))
    if [ "$left" -lt 10 ]; then summary "$name: SKIPPED (budget of $budget s spent)"; return 124; fi
    [ "$cap" -gt "$left" ] && cap=$left
    t0=$(date +%s)
    timeout "$cap" "$@" >"$tmp/$name.txt" 2>&1
    rc=$?
    { echo "=== $name (exit $rc): $*"; cat "$tmp/$name.txt"; } >>"$out/$log.txt"
    summary "$name: exit $rc in $(( $(date +%s) - t0 )) s (limit $cap): $(tail -1 "$tmp/$name.txt" | cut -c1-160)"
    return $rc
}
keep() { grep -E "$2" "$tmp/$1.txt" | cut -c1-240 >>"$out/summary.txt"; }   # keep NAME PATTERN: lines for the summary

# 1. the lab
run lab lab_selftest 30 "$lab" --cpu-selftest --seed 1
keep lab_selftest "v6 emulation|FAIL"
run lab lab_check_v6.1 90 "$lab" --version 6 --variant 1 --check --seed 7
keep lab_check_v6.1 "^v6|skipped|FAIL|error|CUDA|^check:"
for shape in 16,2048,8,4,64 16,1024,16,8,128; do
    name=lab_bench_${shape//,/_}
    run lab "$name" 45 "$lab" --bench-list 2,6.1 --shape "$shape" --reps 20 --rounds 2 --seed 5
    keep "$name" "^v2 |^v6.1 |v6.1 HD=.*regs|error|CUDA"
done

# 2. the trainer's GPU checks
run test_mhar_full test_mhar_full 240 ./test_mhar
keep test_mhar_full "FAIL|HD=(64|128) T=|C=(512|1024) |causal 100m|bit-identical|passed,"

# 3. A/B throughput (PROFILE=0: no per-op tables)
run ab_100m ab_100m 150 env ROUNDS=2 STEPS=12 PROFILE=0 bash dev/ab_gpu.sh "$old" ./train_mhar_cu "-r std" "-r mhar -H 8"
keep ab_100m "^ab_gpu|^mode|^-r "

# 4. memcheck
san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [ -x "$san" ]; then
    run memcheck memcheck_lab 60 "$san" --tool memcheck "$lab" --version 6 --variant 1 --check --shape 2,100,4,1,64 --seed 3
    keep memcheck_lab "ERROR SUMMARY|^v6"
    run memcheck memcheck_lab_hd128 45 "$san" --tool memcheck "$lab" --version 6 --variant 1 --check --shape 2,7,4,2,128 --seed 3
    keep memcheck_lab_hd128 "ERROR SUMMARY|^v6"
    run memcheck memcheck_test_mhar 120 env MHAR_GPU_QUICK=1 "$san" --tool memcheck ./test_mhar
    keep memcheck_test_mhar "ERROR SUMMARY|passed,"
else
    summary "compute-sanitizer: not found, memcheck skipped"
fi
summary "total: $(( $(date +%s) - t_start )) s"
cat "$out/summary.txt"
