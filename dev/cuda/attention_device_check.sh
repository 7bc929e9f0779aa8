#!/usr/bin/env bash
# One device call for the attention lab's forward on wgmma/TMA (v5), about 3-4 minutes on an H200:
#   1. build dev/cuda/attention (ptxas -v: the v5 kernels' registers and spills, and any wgmma
#      serialisation warning, C751x, of a forward kernel), unless a built one newer than attention.cu
#      is there;
#   2. --cpu-selftest (CPU reference, fragment and v5 layout emulations, the v5.4 / v5.5 order models);
#   3. v5 --check, variants 0-5, on the lab's shapes (CPU fp64 reference, v2's forward, repeats;
#      variants 2, 4, 5 also at the tails T = 200, 100, 7);
#   4. --bench: v2 and v5 variants 2, 4, 5 (those that passed) side by side at the 100m, 350m and
#      HD=128 shapes; then --bench-list 5.2,5.4,5.5: the forward in turns on one input set, 3 passes,
#      at the 100m and HD=128 shapes;
#   5. PyTorch SDPA, FLASH_ATTENTION and CUDNN_ATTENTION, forward and backward, at the 100m and HD=128
#      shapes (dev/cuda/attention_torch_bench.py; /opt/torch/.venv/bin/python or $TORCH_PY);
#   6. compute-sanitizer memcheck (HD 64 and 128, and a tail at T = 100) and racecheck (HD 64) of v5
#      --check, the variants that passed, on small shapes.
# Every step runs under timeout and keeps going after a failure. Logs go to $OUT (default
# runs/attention_device); the summary is printed and kept in $OUT/summary.txt.
#   bash dev/cuda/attention_device_check.sh          OUT=/some/dir bash dev/cuda/attention_device_check.sh
set -u
cd "$(dirname "$0")/../.."
out=${OUT:-runs/attention_device}
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
    timeout 420 "$nvcc" -O3 -std=c++17 -arch=sm_90a -Xptxas -v -o "$bin.tmp" dev/cuda/attention.cu >"$out/build.txt" 2>&1
    rc=$?
    if [ $rc = 0 ]; then mv "$bin.tmp" "$bin"; else rm -f "$bin.tmp"; fi
    summary "build: exit $rc in $(( $(date +%s) - t0 )) s"
    # registers and spills of the v5 kernels: ILi64ELi0E = HD 64, variant (MODE) 0
    awk '/Function properties for .*attention_forward_wgmma/ { match($0, /ILi[0-9]+ELi[0-9]E/); k = substr($0, RSTART, RLENGTH); n = 2; next }
         n > 0 { sub(/^ *(ptxas info *: *)?/, ""); line = line " " $0; if (--n == 0) { print "v5 kernel " k ":" line; line = "" } }' \
        "$out/build.txt" | tee -a "$out/summary.txt"
    grep -o "(C751[0-9]).*attention_forward_wgmma_kernel[A-Za-z0-9_]*" "$out/build.txt" |
        sed 's/ Potential Performance Loss: wgmma.mma_async instructions are serialized due to / /' | tee -a "$out/summary.txt"
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

run selftest 60 "$bin" --cpu-selftest --seed 1
grep -E "v5 emulation|order model|FAIL" "$out/selftest.txt" | cut -c1-200 | tee -a "$out/summary.txt"

# one process per variant: a variant that traps (its mbarrier watchdog) or hangs takes no other with it
passed=
for var in 0 1 2 3 4 5; do
    run check_v5.$var 90 "$bin" --version 5 --variant $var --check --seed 7 && passed=${passed:+$passed,}$var
    grep -E "^v5|skipped|error|CUDA" "$out/check_v5.$var.txt" | cut -c1-250 | tee -a "$out/summary.txt"
done
summary "v5 variants that passed --check: ${passed:-none}"

# the timed ones: the trainer's 5.2 and the overlapped 4, 5 (0, 1, 3 were timed on 2026-12-02)
timed=$(echo "$passed" | tr , '\n' | grep -x "[245]" | paste -sd, -)
if [ -n "$timed" ]; then
    run bench 180 "$bin" --version 2,5 --variant "$timed" --bench --reps 30 --seed 5
else
    run bench 180 "$bin" --version 2 --bench --reps 30 --seed 5
fi
grep -E "regs|v5 needs|v5:|not timed" "$out/bench.txt" | cut -c1-200 | tee -a "$out/summary.txt"
sed -n '/^ver /,$p' "$out/bench.txt" | tee -a "$out/summary.txt"
if [ -n "$timed" ]; then
    cfgs=$(echo "$timed" | sed 's/\([0-9]\)/5.\1/g')
    for shape in 16,2048,8,4,64 16,1024,16,8,128; do
        name=bench_list_${shape//,/_}
        run "$name" 90 "$bin" --bench-list "$cfgs" --shape "$shape" --reps 30 --rounds 3 --seed 5
        sed -n '/, forward, median/,$p' "$out/$name.txt" | tee -a "$out/summary.txt"
    done
fi

py=${TORCH_PY:-/opt/torch/.venv/bin/python}
[ -x "$py" ] || py=python3
run torch_sdpa 240 "$py" dev/cuda/attention_torch_bench.py --reps 30 --warmup 5
grep -E "^(torch|sdpa)" "$out/torch_sdpa.txt" | tee -a "$out/summary.txt"

san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [ -x "$san" ]; then
    for tool_shape in memcheck:1,256,2,1,64 memcheck:1,256,2,1,128 memcheck:2,100,4,1,64 racecheck:1,256,2,1,64; do
        tool=${tool_shape%%:*} shape=${tool_shape#*:} name=sanitizer_${tool_shape//[:,]/_}
        run "$name" 90 "$san" --tool "$tool" "$bin" --version 5 --variant "${passed:-0,1,2,3,4,5}" --check --shape "$shape" --seed 3
        grep -E "ERROR SUMMARY|RACECHECK SUMMARY|^v5" "$out/$name.txt" | cut -c1-200 | tee -a "$out/summary.txt"
    done
else
    summary "compute-sanitizer: not on the PATH, skipped"
fi
