#!/usr/bin/env bash
# Everything the CUDA trainer is checked with on a GPU machine, in one go:
# build, the GPU test (test_mhar), compute-sanitizer memcheck and racecheck on
# it, two identical runs of the bf16 trainer (bit-identical losses and
# samples), and a throughput run of the 100M model on random tokens.
#   bash dev/cuda/device_check.sh [OUTDIR]      (logs in OUTDIR, default runs/device)
#   MHAR_CHECK_100M=0 bash dev/cuda/device_check.sh   skips the 100M throughput runs
# It also runs the CPU and the fp32 GPU trainer for 2 steps at the 100M shape (attnres,
# mhar H=8, block H=16 S=4) and prints their losses and gradient norms side by side.
# Prints a short summary; the full logs stay in OUTDIR.
set -u
out=${1:-runs/device}
mkdir -p "$out" runs/shards
summary() { echo "$*" | tee -a "$out/summary.txt"; }
summary "device: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1); $(nvcc --version | tail -1)"

t0=$(date +%s)
make -j8 train_mhar test_mhar train_mhar_cu train_mhar_cu_fp32 >"$out/build.txt" 2>&1
summary "build: exit $? in $(( $(date +%s) - t0 )) s, $(grep -ci warning "$out/build.txt") warning lines"

t0=$(date +%s)
./test_mhar >"$out/test.txt" 2>&1
summary "test_mhar: exit $? in $(( $(date +%s) - t0 )) s: $(tail -1 "$out/test.txt")"
grep -E "^(FAIL|SKIP)|GPU|checkpoints cross" "$out/test.txt" | cut -c1-230 | tee -a "$out/summary.txt"

for tool in memcheck racecheck; do
    t0=$(date +%s)
    quick=; [ $tool = racecheck ] && quick=1   # racecheck is slow: the quick subset of the GPU checks
    env ${quick:+MHAR_GPU_QUICK=1} timeout 200 compute-sanitizer --tool $tool --target-processes application-only ./test_mhar >"$out/$tool.txt" 2>&1
    rc=$?
    summary "sanitizer $tool: exit $rc in $(( $(date +%s) - t0 )) s; $(grep -c 'ERROR SUMMARY: 0 errors' "$out/$tool.txt") processes with 0 errors, $(grep 'ERROR SUMMARY' "$out/$tool.txt" | grep -vc ': 0 errors') with errors; $(tail -1 "$out/$tool.txt" | cut -c1-80)"
done

python3 dev/make_shard.py runs/shards/rand_000000.bin --tokens 2000000 --vocab 50257 --seed 1 >/dev/null
common="-preset 100m -r mhar -H 8 -i runs/shards/rand_000000.bin -val_every 0 -warmup 10 -lr 1e-3"
for r in a b; do
    ./train_mhar_cu $common -b 4 -n 6 -sample_every 3 -sample_len 12 -o "$out/det_$r" -overwrite 1 >"$out/det_$r.txt" 2>&1
done
cut -d' ' -f1-4 "$out/det_a/log.txt" >"$out/det_a.losses"; cut -d' ' -f1-4 "$out/det_b/log.txt" >"$out/det_b.losses"
if cmp -s "$out/det_a.losses" "$out/det_b.losses" && diff <(grep -A1 'sample ---' "$out/det_a.txt") <(grep -A1 'sample ---' "$out/det_b.txt") >/dev/null \
   && [ "$(wc -l <"$out/det_a.losses")" = 6 ]; then
    summary "determinism (100m bf16 mhar H=8, B=4, 6 steps, 2 samples): identical; last: $(tail -1 "$out/det_a.losses")"
else
    summary "determinism: DIFFERENT or failed"; tail -n 3 "$out/det_a.txt" "$out/det_b.txt" | tee -a "$out/summary.txt"
fi

# The 100M shape (C=512: routing layouts the tiny test shapes do not reach, attnres
# included) against the CPU trainer: fp32 GPU vs fp32 CPU, 2 steps of one sequence.
for mode in "mhar -H 1" "mhar -H 8" "mhar -H 16 -S 4"; do
    tag=$(echo $mode | tr -d ' -')
    flags="-preset 100m -r $mode -i runs/shards/rand_000000.bin -j '' -b 1 -n 2 -warmup 1 -lr 1e-3 -sample_every 0 -val_every 0"
    eval ./train_mhar $flags >"$out/cpu100m_$tag.txt" 2>&1
    eval ./train_mhar_cu_fp32 $flags >"$out/gpu100m_$tag.txt" 2>&1
    summary "100m $mode CPU vs GPU fp32 (loss, norm of steps 1-2): $(paste -d' ' <(awk -F'|' '/^step/ {printf "%s%s", $2, $4}' "$out/cpu100m_$tag.txt") <(awk -F'|' '/^step/ {printf "%s%s", $2, $4}' "$out/gpu100m_$tag.txt") | tr -s ' ' | sed 's/loss//g; s/norm//g')"
done

[ "${MHAR_CHECK_100M:-1}" = 0 ] && exit 0   # skip the throughput runs
for mode in "mhar -H 8" "std"; do
    tag=$(echo $mode | tr -d ' -')
    ./train_mhar_cu -preset 100m -r $mode -i runs/shards/rand_000000.bin -j '' -b 16 -n 6 -sample_every 0 >"$out/t100m_$tag.txt" 2>&1
    summary "100m $mode B=16 T=2048 bf16: exit $?; $(grep -E '^step +6/' "$out/t100m_$tag.txt" | cut -c1-110); $(grep '^done' "$out/t100m_$tag.txt")"
    ./train_mhar_cu_fp32 -preset 100m -r $mode -i runs/shards/rand_000000.bin -j '' -b 16 -n 2 -sample_every 0 >"$out/t100m_fp32_$tag.txt" 2>&1
    summary "100m $mode B=16 T=2048 fp32: exit $?; $(grep -E '^step +2/' "$out/t100m_fp32_$tag.txt" | cut -c1-110)"
done
