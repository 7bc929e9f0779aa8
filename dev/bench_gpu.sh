#!/usr/bin/env bash
# GPU benchmark: our CUDA trainer (std, mhar H=8, block S=4 and S=8, hc n=4, delta H=8 S=8) and the PyTorch
# baseline (dev/torch_ref/bench_torch.py: torch.compile + bf16 autocast + SDPA + fused AdamW), side
# by side in one run. The 100M model, B=16, T=2048, random tokens, GPT-2's vocabulary (Vp 50304).
# PyTorch runs in the configuration TORCH_ARGS names (default: fast_model.py with max-autotune and
# cuDNN attention; `bench_torch.py --hunt` times the alternatives and prints the fastest that
# trains SPEC's model as "best same-work flags", the ones to pass).
# Prints tokens/s, MFU, peak GPU memory of each, and the ratios the issue targets:
#   std >= 1.10x PyTorch std;  mhar H=8 >= 0.93x our std;  block >= 0.97x our std;
#   memory of mhar <= 1.10x our std. hc n=4 (hyper-connections, SPEC section 8) is reported
#   beside them with its speed and memory against our std (no target: n streams cost n times
#   std's residual bytes; dev/cuda/hc.cu's notes give the expected figures), and delta AttnRes
#   H=8 S=8 (SPEC section 9) from its initialisation (a converted model runs the same kernels).
# MFU counts 6 * parameters + 12 * L * C * T FLOPs per token (PaLM's convention, as
# dev/bench_cpu.sh), against the H200's 989 TFLOP/s dense bf16.
# Then a per-op breakdown of our std, mhar H=8 and hc n=4: the trainer's own table (-op_times 1: the GPU
# time of each op range, kernels/common.cuh, from CUDA events; no profiler needed), mean over 5 steps.
#   usage: bash dev/bench_gpu.sh   (env: STEPS=15 B=16 T=2048 PRESET=100m TRAINER PEAK_TFLOPS PYTHON
#                                   TORCH=1 (0: skip PyTorch)  TORCH_ARGS (bench_torch.py's flags)
#                                   TORCH_MHAR_ARGS (its flags for mhar; default TORCH_ARGS, with
#                                   --impl plain, which is std only, as --impl fast)
#                                   PROFILE=1 (0: skip the breakdown)
#                                   RUNS="std mhar8 block4 block8 hc4 delta8" (our runs to measure; std is
#                                   always one, the others' ratios are against it)
#                                   MAKE=1 (0: use TRAINER as it is when it exists, without make))
# Dry run without a GPU (no block8: the test preset has 4 sublayers):
#   TRAINER=./train_mhar PRESET=test T=16 B=4 RUNS="std mhar8 block4 hc4 delta8" TORCH_DEVICE=cpu PYTHON=/usr/bin/python3 bash dev/bench_gpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-15} B=${B:-16} T=${T:-2048} PRESET=${PRESET:-100m} TRAINER=${TRAINER:-./train_mhar_cu}
PEAK_TFLOPS=${PEAK_TFLOPS:-989} TORCH_DEVICE=${TORCH_DEVICE:-cuda} PYTHON=${PYTHON:-python3}
RUNS=${RUNS:-"std mhar8 block4 block8 hc4 delta8"}
for k in $RUNS; do
    case $k in std|mhar8|block4|block8|hc4|delta8) ;; *) echo "error: RUNS names '$k'; use std mhar8 block4 block8 hc4 delta8" >&2; exit 1 ;; esac
done
case " $RUNS " in *" std "*) ;; *) echo "error: RUNS='$RUNS' lacks std, which the ratios divide by; add it" >&2; exit 1 ;; esac
if [ "${MAKE:-1}" = 0 ] && [ -x "$TRAINER" ]; then :; else make -s "${TRAINER#./}"; fi
mkdir -p data/bench
[ -f data/bench/random_3m.bin ] || python3 dev/make_shard.py data/bench/random_3m.bin --tokens 3000000 --vocab 50257
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
echo "bench_gpu: ${GPU:-no GPU}; $PRESET, B=$B, T=$T, $STEPS steps per run"

# our trainer on the random shard, no validation or samples; extra flags follow
train() {
    "$TRAINER" -preset "$PRESET" -T "$T" -b "$B" -warmup 1 -i data/bench/random_3m.bin -j '' \
        -sample_every 0 -val_every 0 "$@"
}
# mean tokens/s after the first 3 steps, GPU memory in use at the end, parameters
ours() {
    local log
    log=$(train -n "$STEPS" "$@" 2>&1) || { echo "$log" >&2; exit 1; }
    local tps mem params
    tps=$(echo "$log" | awk -F'|' '/^step/ {split($6, a, " "); n++; if (n > 3) {s += a[1]; k++}} END {printf "%.0f", k ? s / k : 0}')
    mem=$(echo "$log" | sed -n 's/.*GPU memory in use \([0-9.]*\) MiB.*/\1/p')
    params=$(echo "$log" | awk '/^parameters:/ {print $2}')
    echo "$tps ${mem:-0} $params"
}
# the torch model with the preset's shape
case $PRESET in
    100m) SHAPE="--L 12 --C 512 --NH 8 --NKV 4 --F 1536" ;;
    test) SHAPE="--L 2 --C 32 --NH 4 --NKV 2 --F 48" ;;
    *) echo "error: PRESET=$PRESET: use 100m (or test for a dry run)" >&2; exit 1 ;;
esac
# PyTorch's configuration (on a CPU dry run: no torch.compile, which torch 1.13 lacks)
if [ "$TORCH_DEVICE" = cpu ]; then
    TORCH_ARGS=${TORCH_ARGS:-"--impl fast --compile-mode none"}
else
    TORCH_ARGS=${TORCH_ARGS:-"--impl fast --compile-mode max-autotune-no-cudagraphs --sdpa cudnn"}
fi
# mhar in PyTorch: the same configuration, but plain_model.py is std only, so --impl plain becomes fast
TORCH_MHAR_ARGS=${TORCH_MHAR_ARGS:-${TORCH_ARGS/--impl plain/--impl fast}}
# prints bench_torch.py's line (the whole configuration) on stderr, "tok_s peak_mib" on stdout
theirs() {
    local line
    local args=$TORCH_ARGS
    case " $* " in *" --mode mhar "*) args=$TORCH_MHAR_ARGS ;; esac
    line=$("$PYTHON" dev/torch_ref/bench_torch.py --device "$TORCH_DEVICE" $SHAPE --T "$T" --B "$B" \
        --steps "$STEPS" --warmup 5 $args "$@" | grep '^torch ' | tail -1) || true
    if [ -z "$line" ]; then
        echo "error: bench_torch.py $args $* printed no result line (see its error above); fix TORCH_ARGS or TORCH_MHAR_ARGS" >&2
        return 1
    fi
    echo "$line" >&2
    echo "$line" | awk '{for (i = 1; i < NF; i++) {if ($i == "tok_s") t = $(i + 1); if ($i == "peak_mib") m = $(i + 1)}
                         print t, m}'
}

declare -A TPS MEM FLAGS
got() { echo "measured $1: ${TPS[$1]} tokens/s, ${MEM[$1]} MiB"; }   # as each run ends
FLAGS[std]="-r std" FLAGS[mhar8]="-r mhar -H 8" FLAGS[block4]="-r mhar -H 8 -S 4" FLAGS[block8]="-r mhar -H 8 -S 8"
FLAGS[hc4]="-r hc -hc_n 4" FLAGS[delta8]="-r delta -H 8 -S 8"
read -r TPS[std] MEM[std] P < <(ours ${FLAGS[std]}); got std
for k in mhar8 block4 block8 hc4 delta8; do
    case " $RUNS " in *" $k "*) read -r TPS[$k] MEM[$k] _ < <(ours ${FLAGS[$k]}); got $k ;; esac
done
if [ "${TORCH:-1}" = 1 ]; then   # (TORCH=0: no PyTorch rows)
    read -r TPS[torch_std] MEM[torch_std] < <(theirs --mode std); got torch_std
    read -r TPS[torch_mhar8] MEM[torch_mhar8] < <(theirs --mode mhar --H 8); got torch_mhar8
fi

L=$(case $PRESET in 100m) echo 12 ;; *) echo 2 ;; esac)
C=$(case $PRESET in 100m) echo 512 ;; *) echo 32 ;; esac)
{
    for k in std mhar8 block4 block8 hc4 delta8 torch_std torch_mhar8; do
        if [ -n "${TPS[$k]:-}" ]; then echo "$k ${TPS[$k]} ${MEM[$k]}"; fi
    done
} | awk -v P="$P" -v L="$L" -v C="$C" -v T="$T" -v peak="$PEAK_TFLOPS" '
    { name[NR] = $1; tps[$1] = $2; mem[$1] = $3 }
    END {
        fpt = 6 * P + 12 * L * C * T
        printf "\n%-12s %12s %8s %12s %10s %10s\n", "run", "tokens/s", "MFU", "memory GiB", "vs our std", "vs torch std"
        for (i = 1; i <= NR; i++) {
            k = name[i]
            vt = (tps["torch_std"] > 0) ? sprintf("%10.3f", tps[k] / tps["torch_std"]) : sprintf("%10s", "-")
            printf "%-12s %12.0f %7.1f%% %12.2f %10.3f %s\n", k, tps[k], 100 * tps[k] * fpt / (peak * 1e12),
                   mem[k] / 1024, tps[k] / tps["std"], vt
        }
        if (("mhar8" in tps) && ("block4" in tps) && ("block8" in tps))
            printf "\ntargets: std/torch_std %s (>= 1.10), mhar8/std %.3f (>= 0.93), block4/std %.3f and block8/std %.3f (>= 0.97), mhar8 memory/std %.3f (<= 1.10)\n",
                   (tps["torch_std"] > 0 ? sprintf("%.3f", tps["std"] / tps["torch_std"]) : "-"), tps["mhar8"] / tps["std"], tps["block4"] / tps["std"],
                   tps["block8"] / tps["std"], (mem["std"] > 0 ? mem["mhar8"] / mem["std"] : 0)
        if ("hc4" in tps)
            printf "hc n=4 against our std: speed %.3f (goal >= 0.90), memory %.3f (goal <= 1.30)\n", tps["hc4"] / tps["std"], (mem["std"] > 0 ? mem["hc4"] / mem["std"] : 0)
        if ("delta8" in tps)
            printf "delta H=8 S=8 (SPEC section 9, from its initialisation) against our std: speed %.3f, memory %.3f\n", tps["delta8"] / tps["std"], (mem["std"] > 0 ? mem["delta8"] / mem["std"] : 0)
        printf "(MFU: %.3g FLOPs/token = 6 x %d parameters + 12 L C T, of %d TFLOP/s; memory: ours = GPU memory in use at the end, torch = max allocated)\n", fpt, P, peak
    }'

# per-op breakdown: the trainer's -op_times table (GPU time of each op range, mean over the 5 steps after
# the first; the CPU trainer has none)
if [ "${PROFILE:-1}" = 1 ] && [ "$TRAINER" != ./train_mhar ]; then
    for k in std mhar8 hc4; do
        case " $RUNS " in *" $k "*) ;; *) continue ;; esac
        echo
        echo "per-op breakdown, our ${FLAGS[$k]#-r }:"
        log=$(train -n 6 -op_times 1 ${FLAGS[$k]} 2>&1) || { echo "$log" >&2; exit 1; }
        sed -n '/^per-op GPU time/,/^  total/p' <<< "$log"
    done
fi
