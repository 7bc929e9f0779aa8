#!/usr/bin/env bash
# One device call for a change to the routing kernels: the lab's check of the new version
# and its bench against the last (full mode and block S=4), the GPU test, then the trainer
# against an earlier one side by side (dev/ab_gpu.sh, when AB_A names it) and the routing
# lines of the per-op profile of each.
#   bash dev/cuda/route_check.sh [OUTDIR]     (logs in OUTDIR, default runs/route; a summary last)
#   env: LAB_NEW=16 LAB_OLD=14 (lab versions: the bench runs LAB_OLD .. LAB_NEW),
#        AB_A=the A side (a built train_mhar_cu, or a train_mhar.cu extracted with its common/
#        and kernels/; none: no A/B), SANITIZE=1 (then memcheck and racecheck
#        on test_mhar's quick subset), SKIP_BUILD=1 (use the binaries already here: dev/cuda/route,
#        test_mhar, train_mhar, train_mhar_cu, train_mhar_cu_fp32), ROUNDS=2
set -u
cd "$(dirname "$0")/../.."
out=${1:-runs/route}
mkdir -p "$out"
new=${LAB_NEW:-16} old=${LAB_OLD:-14} aba=${AB_A:-}
summary() { echo "$*" | tee -a "$out/summary.txt"; }
: >"$out/summary.txt"
summary "device: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1)"
if [ "${SKIP_BUILD:-0}" != 1 ]; then
    t0=$(date +%s)
    make -j16 dev/cuda/route train_mhar test_mhar train_mhar_cu train_mhar_cu_fp32 >"$out/build.txt" 2>&1
    summary "build: exit $? in $(( $(date +%s) - t0 )) s"
fi

t0=$(date +%s)
./dev/cuda/route --version "$new" --check --seed 11 >"$out/lab_check.txt" 2>&1
summary "lab v$new --check: exit $? in $(( $(date +%s) - t0 )) s: $(grep -E "check: (PASS|FAIL)" "$out/lab_check.txt")"
grep -E "FAIL" "$out/lab_check.txt" | head -5 | cut -c1-250 | tee -a "$out/summary.txt"

t0=$(date +%s)
for S in 1 4; do
    ./dev/cuda/route --version "$old" --vmax "$new" --bench --S $S --seed 5 >"$out/lab_bench_S$S.txt" 2>&1
    grep -E "^v($old|$new) L=" "$out/lab_bench_S$S.txt" | sed -E 's/  +/ /g' | cut -c1-230 | tee -a "$out/summary.txt"
done
summary "lab bench: $(( $(date +%s) - t0 )) s"

t0=$(date +%s)
./test_mhar >"$out/test.txt" 2>&1
summary "test_mhar: exit $? in $(( $(date +%s) - t0 )) s: $(tail -1 "$out/test.txt")"
grep -E "^FAIL" "$out/test.txt" | cut -c1-230 | tee -a "$out/summary.txt"

if [ -n "$aba" ]; then
    t0=$(date +%s)
    ROUNDS=${ROUNDS:-2} PROFILE_GREP='route|bwd matmul' bash dev/ab_gpu.sh "$aba" train_mhar_cu "-r mhar -H 8" \
        "-r mhar -H 8 -S 4" "-r mhar -H 8 -S 8" >"$out/ab.txt" 2>&1
    summary "A/B (A: $aba, B: this train_mhar_cu), exit $? in $(( $(date +%s) - t0 )) s:"
    sed -n '/^mode/,/^$/p' "$out/ab.txt" | tee -a "$out/summary.txt"
    grep -E "^profile|route|bwd matmul|^  total" "$out/ab.txt" | tee -a "$out/summary.txt"
fi

if [ "${SANITIZE:-0}" = 1 ]; then   # memcheck and racecheck on the quick subset (its bf16 flash configs take the new path)
    for tool in memcheck racecheck; do
        t0=$(date +%s)
        MHAR_GPU_QUICK=1 timeout 240 compute-sanitizer --tool $tool --target-processes application-only ./test_mhar \
            >"$out/$tool.txt" 2>&1
        summary "sanitizer $tool: exit $? in $(( $(date +%s) - t0 )) s; $(grep -c 'ERROR SUMMARY: 0 errors' "$out/$tool.txt") runs with 0 errors; $(grep 'ERROR SUMMARY' "$out/$tool.txt" | grep -vc ': 0 errors') with errors; $(tail -1 "$out/$tool.txt" | cut -c1-60)"
    done
fi
