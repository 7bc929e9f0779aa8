#!/usr/bin/env bash
# A/B of two versions of train_mhar.cu on one GPU, side by side in one run: builds both
# (bf16), then alternates A and B runs (ROUNDS rounds per mode) on the 100M model, B=16,
# T=2048, random tokens, and prints the mean tokens/s of each, B/A, and the GPU memory in use
# at the end of each side's last run, per mode; with
# PROFILE=1 also the routing lines of each one's per-op table (the trainer's -op_times 1: GPU
# time of each op range, mean over the 5 steps after the first; a version without -op_times
# shows its error line instead). Alternating rounds spread clock and thermal drift over both sides.
#   usage: bash dev/ab_gpu.sh A B ["mode flags" ...]
#          A, B: a version of train_mhar.cu (built here, bf16), or a built train_mhar_cu binary;
#          the same file twice is built once (then A_ENV / B_ENV make the difference)
#          (default modes: "-r std" "-r mhar -H 8" "-r mhar -H 8 -S 4")
#   env: ROUNDS=2 STEPS=12 PROFILE=1 GPU_ARCH=sm_90a PROFILE_GREP='route|residual'
#        (the table's op lines shown, beside its header and total); A_ENV, B_ENV: variables
#        for the A or B runs only, as "NAME=value ..."
# Example (a version whose headers differ: extract it with them, its own includes come first):
#   mkdir -p /tmp/a && git archive main train_mhar.cu common kernels | tar -x -C /tmp/a
#   bash dev/ab_gpu.sh /tmp/a/train_mhar.cu train_mhar.cu
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { echo "usage: bash dev/ab_gpu.sh A B [\"mode flags\" ...]  (A, B: train_mhar.cu versions or binaries)" >&2; exit 2; }
A=$1 B=$2; shift 2
for f in "$A" "$B"; do
    [ -f "$f" ] || { echo "error: $f: no such file; give two versions of train_mhar.cu, or built binaries" >&2; exit 2; }
done
modes=("$@"); [ ${#modes[@]} -gt 0 ] || modes=("-r std" "-r mhar -H 8" "-r mhar -H 8 -S 4")
ROUNDS=${ROUNDS:-2} STEPS=${STEPS:-12} GPU_ARCH=${GPU_ARCH:-sm_90a}
PROFILE_GREP=${PROFILE_GREP:-route|residual}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
flags="-O3 -std=c++17 -arch=$GPU_ARCH -diag-suppress 177 -I. -lcublasLt -lcublas -lcudart"   # -I.: common/
t0=$(date +%s)
build() {   # source or binary, output
    case "$1" in
        *.cu) nvcc $flags -o "$2" "$1" ;;
        *) [ -x "$1" ] || { echo "error: $1: neither a .cu file nor an executable" >&2; exit 2; }; cp "$1" "$2" ;;
    esac
}
build "$A" "$tmp/a" & pa=$!
if [ "$(realpath "$A")" = "$(realpath "$B")" ]; then wait $pa; cp "$tmp/a" "$tmp/b"
else build "$B" "$tmp/b" & pb=$!; wait $pa; wait $pb; fi
echo "ab_gpu: A = $A${A_ENV:+ with $A_ENV}, B = $B${B_ENV:+ with $B_ENV}; ready in $(( $(date +%s) - t0 )) s;" \
     "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
mkdir -p data/bench
[ -f data/bench/random_3m.bin ] || python3 dev/make_shard.py data/bench/random_3m.bin --tokens 3000000 --vocab 50257
train() {   # binary, steps, mode flags...  (A_ENV / B_ENV by the binary)
    local bin=$1 n=$2 envs; shift 2
    if [ "$bin" = "$tmp/a" ]; then envs=${A_ENV:-}; else envs=${B_ENV:-}; fi
    env $envs "$bin" -preset 100m -T 2048 -b 16 -warmup 1 -i data/bench/random_3m.bin -j '' -sample_every 0 -val_every 0 -n "$n" "$@"
}
tps() {     # mean tokens/s after the first 3 steps
    awk -F'|' '/^step/ {split($6, a, " "); n++; if (n > 3) {s += a[1]; k++}} END {printf "%.0f", k ? s / k : 0}'
}
mem() {     # GPU memory in use at the end of the run, MiB
    sed -n 's/.*GPU memory in use \([0-9.]*\) MiB.*/\1/p' | tail -1
}
printf "\n%-22s %12s %12s %8s %10s %10s\n" "mode" "A tokens/s" "B tokens/s" "B/A" "A MiB" "B MiB"
for m in "${modes[@]}"; do
    sa=0 sb=0
    for ((r = 0; r < ROUNDS; r++)); do
        la=$(train "$tmp/a" "$STEPS" $m 2>&1); lb=$(train "$tmp/b" "$STEPS" $m 2>&1)
        a=$(tps <<< "$la") b=$(tps <<< "$lb") ma=$(mem <<< "$la") mb=$(mem <<< "$lb")
        sa=$((sa + a)) sb=$((sb + b))
    done
    awk -v m="$m" -v a="$sa" -v b="$sb" -v r="$ROUNDS" -v ma="${ma:-0}" -v mb="${mb:-0}" \
        'BEGIN {printf "%-22s %12.0f %12.0f %8.4f %10.0f %10.0f\n", m, a / r, b / r, b / a, ma, mb}'
done
if [ "${PROFILE:-1}" = 1 ]; then
    for m in "${modes[@]}"; do
        for s in a b; do
            echo; echo "profile $s, $m (GPU time per op range, mean over 5 steps):"
            log=$(train "$tmp/$s" 6 -op_times 1 $m 2>&1) || true
            table=$(sed -n '/^per-op GPU time/,/^  total/p' <<< "$log")
            if [ -n "$table" ]; then grep -E "^per-op|^  op |^  total|$PROFILE_GREP" <<< "$table" || true
            else echo "no per-op table (a version without -op_times?): $(tail -1 <<< "$log")"; fi
        done
    done
fi
