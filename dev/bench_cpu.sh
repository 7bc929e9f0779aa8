#!/usr/bin/env bash
# CPU benchmark (issue 2): the 100M model at B=4, T=256, std and mhar H=8 side
# by side in one run. Prints tokens/s, achieved GFLOP/s and peak RSS of each,
# and the ratios mhar / std.
#
# FLOPs per token = 6 * P + 12 * L * C * T (PaLM's convention): P counts every
# parameter including the tied embedding (it is the LM head's matrix), and the
# second term is attention's QK^T and AV, forward and backward, without
# discounting the causal mask. Routing FLOPs are not counted, so mhar's figure
# is the useful model FLOPs it achieves.
#   usage: bash dev/bench_cpu.sh [steps=4]
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-4}
[ -x ./train_mhar ] || make train_mhar >/dev/null
mkdir -p data/bench
[ -f data/bench/random.bin ] || python3 dev/make_shard.py data/bench/random.bin --tokens 300000 --vocab 50257
L=12; C=512; T=256; B=4
run() {  # mode flags... -> prints "tok_s peak_mib params"
    local log
    log=$(./train_mhar -preset 100m -T $T -b $B -n "$STEPS" -i data/bench/random.bin -j '' \
          -sample_every 0 -val_every 0 -warmup 1 "$@")
    echo "$log" >&2
    # mean tokens/s over the steps after the first (warm-up)
    local toks=$(echo "$log" | awk -F'|' '/^step/ && NR>0 {split($6,a," "); n++; if (n>1) {s+=a[1]; k++}} END {printf "%.1f", k? s/k : 0}')
    local rss=$(echo "$log" | awk '/peak RSS/ {print $4}')
    local params=$(echo "$log" | awk '/^parameters:/ {print $2}')
    echo "$toks $rss $params"
}
echo "running std ..." >&2
read -r STD_TOK STD_RSS P < <(run -r std)
echo "running mhar H=8 ..." >&2
read -r MH_TOK MH_RSS P2 < <(run -r mhar -H 8)
awk -v st="$STD_TOK" -v sr="$STD_RSS" -v mt="$MH_TOK" -v mr="$MH_RSS" -v p="$P" -v L=$L -v C=$C -v T=$T -v th="$(nproc)" 'BEGIN {
    fpt = 6 * p + 12 * L * C * T
    printf "\n100M model, B=4 T=256, %d cores; FLOPs/token = 6*%d + 12*L*C*T = %.3g\n", th, p, fpt
    printf "%-10s %10s %10s %12s\n", "mode", "tokens/s", "GFLOP/s", "peak RSS MiB"
    printf "%-10s %10.1f %10.1f %12.1f\n", "std", st, st * fpt / 1e9, sr
    printf "%-10s %10.1f %10.1f %12.1f\n", "mhar H=8", mt, mt * fpt / 1e9, mr
    printf "ratio mhar/std: tokens/s %.3f (target >= 0.9), peak memory %.3f (target <= 1.2)\n", mt / st, mr / sr
}'
