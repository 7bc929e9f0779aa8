#!/usr/bin/env bash
# One training run of the paper's recipe (SPEC section 6) on the CUDA trainer.
# The per-experiment scripts beside this file call it. It
#   1. times a few steps on the GPU it finds and prints the expected wall time,
#   2. resumes from the newest checkpoint in the run's folder when rerun.
#
#   dev/runs/run.sh NAME PRESET SEQS_PER_STEP STEPS PEAK_LR [trainer flags: -r mhar -H 8 ...]
#
# Environment (all optional):
#   DATA     shard folder with *_train_*.bin, *_val_*.bin, tokenizer.bin  (default data/large)
#   B        micro-batch in sequences (default 16; lower it if the GPU runs out of memory)
#   TRAINER  trainer binary (default ./train_mhar_cu, built if missing)
#   RUNS     parent folder of the run folders (default runs)
#   SEED     seed (default 1337): equal seeds make runs of different modes comparable
#   CKPT_EVERY  steps between checkpoints (default 500)
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 5 ] || { echo "usage: $0 NAME PRESET SEQS_PER_STEP STEPS PEAK_LR [trainer flags]" >&2; exit 1; }
NAME=$1 PRESET=$2 SEQS=$3 STEPS=$4 LR=$5
shift 5
DATA=${DATA:-data/large} B=${B:-16} TRAINER=${TRAINER:-./train_mhar_cu} RUNS=${RUNS:-runs} SEED=${SEED:-1337} CKPT_EVERY=${CKPT_EVERY:-500}
OUT=$RUNS/$NAME

if [ ! -x "$TRAINER" ]; then make "$(basename "$TRAINER")"; fi
ls "$DATA"/*_train_*.bin >/dev/null 2>&1 || { echo "error: no shards in $DATA; make them with: make data/large (or set DATA)" >&2; exit 1; }
case $PRESET in
    100m) T=2048 ;;
    350m|1b) T=1024 ;;
    test) T=16 ;;
    tiny) T=128 ;;
    *) echo "error: preset $PRESET is unknown; use 100m, 350m, 1b (or test, tiny)" >&2; exit 1 ;;
esac
TOKENS_PER_STEP=$((SEQS * T))
[ $((TOKENS_PER_STEP % (B * T))) -eq 0 ] || { echo "error: B=$B does not divide $SEQS sequences per step; set B to a divisor" >&2; exit 1; }

FLAGS=(-preset "$PRESET" -b "$B" -d "$TOKENS_PER_STEP" -n "$STEPS" -lr "$LR" -warmup 1000 -lr_min 0.1
       -wd 0.1 -clip 1.0 -seed "$SEED" -i "$DATA/*_train_*.bin" -j "$DATA/*_val_*.bin" -tok "$DATA/tokenizer.bin" "$@")

# resume from the newest checkpoint, if any
RESUME=() DONE=0
LAST=$(ls "$OUT"/ckpt_*.bin 2>/dev/null | sort | tail -1 || true)
if [ -n "$LAST" ]; then
    RESUME=(-resume "$LAST")
    DONE=$((10#$(basename "$LAST" .bin | sed 's/ckpt_//')))
    echo "run.sh: resuming $NAME from $LAST (step $DONE of $STEPS)"
else
    RESUME=(-overwrite 1)   # no checkpoint yet: a run stopped before its first save starts over
fi
[ "$DONE" -lt "$STEPS" ] || { echo "run.sh: $NAME is complete ($STEPS steps)"; exit 0; }

# expected wall time: time 6 optimizer steps, skip the first 2
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || echo "unknown GPU")
PROBE=$("$TRAINER" "${FLAGS[@]}" -n 6 -warmup 1 -val_every 0 -sample_every 0 2>&1 | awk -F'|' '/^step/ {split($6, a, " "); n++; if (n > 2) {s += a[1]; k++}} END {if (k) printf "%.0f", s / k}')
if [ -n "$PROBE" ]; then
    SECS=$(( (STEPS - DONE) * TOKENS_PER_STEP / PROBE ))
    printf 'run.sh: %s on %s: %d tok/s measured, %d steps left: expected wall time %dh%02dm (without validation)\n' \
        "$NAME" "$GPU" "$PROBE" $((STEPS - DONE)) $((SECS / 3600)) $((SECS % 3600 / 60))
else
    echo "run.sh: could not time a few steps on $GPU; starting anyway" >&2
fi

mkdir -p "$OUT"
"$TRAINER" "${FLAGS[@]}" -val_every 250 -val_batches 16 -sample_every 2000 -ckpt_every "$CKPT_EVERY" -o "$OUT" "${RESUME[@]}" 2>&1 | tee -a "$OUT/stdout.txt"
