#!/usr/bin/env bash
# One device call for the attention lab's wgmma backward (v6), about 60-80 s on an H200 after the build
# (the build: ~40 s, skipped when a dev/cuda/attention newer than attention.cu is there):
#   1. build with ptxas -v; the v6 kernels' registers and spills, any C7514 (serialized wgmma) warning;
#   2. --cpu-selftest (CPU reference; fragment, v5 and v6 layout emulations);
#   3. v6 --check, variants 0, 1 and 2, one process each (CPU fp64 reference, v2's backward on the same
#      inputs, repeats bit-identical);
#   4. --bench-list: backward only (prep + kernels), v2 against the v6 variants that passed, one input
#      set, 2 round-robin passes, at 16,2048,8,4,64 and 16,1024,16,8,128 (the targets: 0.70 and 0.74 ms);
#   5. compute-sanitizer memcheck of v6 --check on one small shape (HD 128, both variants that passed).
# Every step runs under timeout and keeps going after a failure. Logs go to $OUT (default
# runs/attention_v6); the summary is printed and kept in $OUT/summary.txt.
#   bash dev/cuda/attention_v6_check.sh          OUT=/some/dir bash dev/cuda/attention_v6_check.sh
set -u
cd "$(dirname "$0")/../.."
out=${OUT:-runs/attention_v6}
mkdir -p "$out"
: >"$out/summary.txt"
summary() { echo "$*" | tee -a "$out/summary.txt"; }
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
bin=dev/cuda/attention
summary "device: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1); $("$nvcc" --version 2>&1 | tail -1)"

t0=$(date +%s)
if [ -x "$bin" ] && [ "$bin" -nt dev/cuda/attention.cu ]; then
    summary "build: using the prebuilt $bin"
else
    timeout 300 "$nvcc" -O3 -std=c++17 -arch=sm_90a -Xptxas -v -o "$bin.tmp" dev/cuda/attention.cu >"$out/build.txt" 2>&1
    rc=$?
    if [ $rc = 0 ]; then mv "$bin.tmp" "$bin"; else rm -f "$bin.tmp"; tail -20 "$out/build.txt" | tee -a "$out/summary.txt"; fi
    summary "build: exit $rc in $(( $(date +%s) - t0 )) s"
    # ILi64ELi2ELb0E = HD 64, 2 warpgroups, serial (variant 0); ELi1ELb0E variant 1; ELi2ELb1E variant 2
    awk '/Compiling entry function .*backward_d(q|kdv)_wgmma/ { match($0, /_Z[0-9]+attention_backward_d(q|kdv)_wgmma_kernelILi[0-9]+ELi[0-9]ELb[01]E/); k = substr($0, RSTART, RLENGTH); n = 2; next }
         n > 0 && /Function properties/ { next }
         n > 0 { sub(/^ *(ptxas info *: *)?/, ""); line = line " " $0; if (--n == 0) { print "v6 kernel " k ":" line; line = "" } }' \
        "$out/build.txt" | sed 's/_Z[0-9]*attention_backward_//' | tee -a "$out/summary.txt"
    grep C7514 "$out/build.txt" | grep -o "function '[^']*" | sort -u | sed 's/^/C7514 in /' | tee -a "$out/summary.txt"
fi

run() {   # run NAME SECONDS CMD...: logs to $out/NAME.txt, one summary line with the exit status and the last line
    local name=$1 secs=$2 t0 rc
    shift 2
    t0=$(date +%s)
    timeout "$secs" "$@" >"$out/$name.txt" 2>&1
    rc=$?
    summary "$name: exit $rc in $(( $(date +%s) - t0 )) s: $(tail -1 "$out/$name.txt" | cut -c1-200)"
    return $rc
}

run selftest 30 "$bin" --cpu-selftest --seed 1
grep -E "v6 emulation|FAIL" "$out/selftest.txt" | cut -c1-200 | tee -a "$out/summary.txt"

# one process per variant: a variant that traps (its mbarrier watchdog) or hangs takes no other with it
passed=
for var in 0 1 2; do
    run check_v6.$var 60 "$bin" --version 6 --variant $var --check --seed 7 && passed=${passed:+$passed,}$var
    grep -E "^v6|skipped|error|CUDA" "$out/check_v6.$var.txt" | cut -c1-260 | tee -a "$out/summary.txt"
done
summary "v6 variants that passed --check: ${passed:-none}"

if [ -n "$passed" ]; then
    cfgs=2
    for var in ${passed//,/ }; do cfgs=$cfgs,6.$var; done
    for shape in 16,2048,8,4,64 16,1024,16,8,128; do
        name=bench_${shape//,/_}
        run "$name" 60 "$bin" --bench-list "$cfgs" --shape "$shape" --reps 20 --rounds 2 --seed 5
        grep -E "regs|^v|^cfg" "$out/$name.txt" | cut -c1-200 | tee -a "$out/summary.txt"
    done
else
    summary "bench: skipped (no v6 variant passed --check)"
fi

san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [ -x "$san" ] && [ -n "$passed" ]; then
    run sanitizer_memcheck 45 "$san" --tool memcheck "$bin" --version 6 --variant "$passed" --check --shape 1,256,4,2,128 --seed 3
    grep -E "ERROR SUMMARY|^v6" "$out/sanitizer_memcheck.txt" | cut -c1-200 | tee -a "$out/summary.txt"
else
    summary "compute-sanitizer: skipped (not on the PATH, or no variant passed)"
fi
