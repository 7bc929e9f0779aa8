#!/usr/bin/env bash
# The study's ordering (attnres far ahead of mhar H=8, -lr_route 8 closing the gap) in float32 on
# the CPU trainer: is it there without bf16 anywhere? Small scale, so that it runs on two cores:
# the tiny preset (L4 C128 NH4 NKV2 F384 T128, GPT-2's vocabulary) on the quick start's Moby Dick
# shards (make data/tiny), 400 steps of 8 x 128 tokens at the quick start's LR, val every 25 steps
# on 8 batches. Each run's log goes to OUT/<method>_s<seed>/log.txt (kept when it exists: rerun
# to finish an interrupted set); then a table of the tail mean (val points after 3/4 of the steps,
# as the study's) per method and seed, and the difference against std paired by seed.
#   usage: bash dev/runs/cpu_ordering.sh [OUT]   (default runs/cpu_ordering; env SEEDS="1 2" STEPS=400
#          DATA=data/tiny: a folder of *_train_*.bin and *_val_*.bin shards of GPT-2 tokens)
# About 2.5 min a run on two cores: 8 runs, about 20 minutes.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-runs/cpu_ordering}
SEEDS=${SEEDS:-"1 2"}
STEPS=${STEPS:-400}
DATA=${DATA:-data/tiny}
make -s train_mhar
if [ "$DATA" = data/tiny ] && [ ! -f data/tiny/tokenizer.bin ]; then make -s data/tiny; fi
declare -A FLAGS=([std]="-r std" [attnres]="-r attnres" [mhar8]="-r mhar -H 8" [mhar8lr8]="-r mhar -H 8 -lr_route 8")
METHODS="std attnres mhar8 mhar8lr8"
for seed in $SEEDS; do
    for m in $METHODS; do
        dir="$OUT/${m}_s$seed"
        if [ -f "$dir/log.txt" ] && grep -q "^step $STEPS val_loss" "$dir/log.txt"; then continue; fi
        echo "cpu_ordering: $m seed $seed ($STEPS steps)"
        mkdir -p "$dir"
        ./train_mhar -preset tiny ${FLAGS[$m]} -seed "$seed" -i "$DATA/*_train_*.bin" \
            -j "$DATA/*_val_*.bin" -b 8 -n "$STEPS" -lr 2e-3 -warmup 30 -val_every 25 -val_batches 8 \
            -sample_every 0 -o "$dir" -overwrite 1 > "$dir.out" 2>&1 \
            || { echo "error: $m seed $seed failed; its output: $dir.out" >&2; tail -3 "$dir.out" >&2; exit 1; }
        mv "$dir.out" "$dir/train.txt"
    done
done
# tail mean of val loss per run, then per method: mean over seeds and the paired difference
for seed in $SEEDS; do
    for m in $METHODS; do
        awk -v m="$m" -v s="$seed" -v n="$STEPS" '$3 == "val_loss" && $2 > 0.75 * n {t += $4; k++}
            END {if (k) printf "%s %s %.4f\n", m, s, t / k}' "$OUT/${m}_s$seed/log.txt"
    done
done | awk '{tail[$1, $2] = $3; if (!($1 in seen)) {seen[$1] = 1; order[++nm] = $1}; if (!($2 in sd)) {sd[$2] = 1; seeds[++ns] = $2}}
    END {
        printf "%-10s", "method"; for (j = 1; j <= ns; j++) printf " %10s", "seed " seeds[j]
        printf " %10s %14s\n", "mean", "vs std (mean)"
        for (i = 1; i <= nm; i++) {
            m = order[i]; s = 0; d = 0
            printf "%-10s", m
            for (j = 1; j <= ns; j++) {printf " %10.4f", tail[m, seeds[j]]; s += tail[m, seeds[j]]; d += tail[m, seeds[j]] - tail["std", seeds[j]]}
            printf " %10.4f %14.4f\n", s / ns, d / ns
        }
    }'
