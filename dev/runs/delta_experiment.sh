#!/usr/bin/env bash
# The delta conversion experiment (doc/SPEC.md section 9): does converting a trained std model into
# delta AttnRes and training on beat training the std model on, for the same steps and tokens?
#
#   on the device:  bash dev/runs/delta_experiment.sh            the three runs below (about 4 minutes
#                                                                 on an H200), packed into $OUT
#   here, after:    bash dev/runs/delta_experiment.sh --report    unpack $OUT's pack first into
#                                                                 dev/results/delta/; writes summary.md,
#                                                                 loss.png and loss_difference.png there
#
#   1. pre      std at the 100m shape, PRE steps (the study's data, LR and schedule, seed 1)
#   2. control  -r std   -init_from pre's last checkpoint, ARM steps
#   3. delta    -r delta -H 8 -S 8 -init_from the same checkpoint, ARM steps
# Both arms restart the same way: step 0, AdamW from zero, a re-warmup of ARM_WARMUP steps to ARM_LR
# and a cosine to 0.1x, and the data continues from pre's position, so they see the same batches,
# tokens the pre-training never saw. They differ only by the conversion. Their val loss is measured
# every ARM_VAL steps on the study's held-out split.
#
# Environment: PRE (800), ARM (400), ARM_LR (3e-4), ARM_WARMUP (40), ARM_VAL (20), TRAINER
# (./train_mhar_cu), RUNS (runs/delta), RESULTS (dev/results/delta), SHAPE ("-preset 100m -b 16
# -d 65536": a smaller one for a smoke test with the CPU trainer). PRE + ARM steps of 65,536 tokens
# must fit the study's 80M train tokens (1,220 steps).
set -euo pipefail
cd "$(dirname "$0")/../.."
PRE=${PRE:-800} ARM=${ARM:-400} ARM_LR=${ARM_LR:-3e-4} ARM_WARMUP=${ARM_WARMUP:-40} ARM_VAL=${ARM_VAL:-20}
TRAINER=${TRAINER:-./train_mhar_cu} RUNS=${RUNS:-runs/delta} RESULTS=${RESULTS:-dev/results/delta}
SHAPE=${SHAPE:--preset 100m -b 16 -d 65536}
die() { echo "delta_experiment: error: $*" >&2; exit 1; }
for v in PRE ARM ARM_WARMUP ARM_VAL; do [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "$v='${!v}' is not a positive whole number"; done
[ $((PRE + ARM)) -le 1220 ] || die "PRE + ARM = $((PRE + ARM)) steps need more than the study's 80M train tokens; keep them at most 1220"

# the last val loss of a log, and the mean of its val points after 3/4 of its steps (the study's tail)
summary_line() {   # NAME LOG STEPS
    awk -v name="$1" -v n="$3" '$3 == "val_loss" {v = $4; if ($2 > 0.75 * n) {s += $4; k++}}
        END {printf "| %s | %.4f | %.4f | %d |\n", name, v, (k ? s / k : 0), k}' "$2"
}

if [ "${1:-}" = --report ]; then
    for r in pre control delta; do [ -f "$RESULTS/$r/log.txt" ] || die "$RESULTS/$r/log.txt missing; unpack the device's delta_results.tar.gz into $RESULTS/"; done
    steps=$(awk '$3 == "val_loss" {s = $2} END {print s}' "$RESULTS/control/log.txt")
    {
        echo "# Delta conversion against the std control (dev/runs/delta_experiment.sh)"
        echo
        sed -n 's/^flags: //p' "$RESULTS/flags.txt"
        echo
        echo "| run | final val loss | tail val loss (last quarter) | tail points |"
        echo "|---|---|---|---|"
        summary_line "pre (std, before the conversion)" "$RESULTS/pre/log.txt" "$(awk '$3 == "val_loss" {s = $2} END {print s}' "$RESULTS/pre/log.txt")"
        summary_line "control (-r std -init_from)" "$RESULTS/control/log.txt" "$steps"
        summary_line "delta (-r delta -H 8 -S 8 -init_from)" "$RESULTS/delta/log.txt" "$steps"
        echo
        awk 'FNR == 1 {f++} $3 == "val_loss" {v[f] = $4} END {
            printf "delta - control, final val loss: %+.4f (negative: the conversion helps)\n", v[2] - v[1]}' \
            "$RESULTS/control/log.txt" "$RESULTS/delta/log.txt"
    } > "$RESULTS/summary.md.tmp"
    mv "$RESULTS/summary.md.tmp" "$RESULTS/summary.md"
    /usr/bin/python3 dev/plot_loss.py "$RESULTS/control" "$RESULTS/delta" --labels "std control" "delta H=8 S=8" \
        --ema 0.9 --title "From the conversion on: std $PRE steps, then $ARM steps each arm" --out "$RESULTS/loss.png"
    # the two curves overlap at this scale: their difference, val point by val point
    /usr/bin/python3 - "$RESULTS" <<'PY'
import sys, matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
sys.path.insert(0, "dev")
from plot_loss import read_log   # (train, val) of a trainer log, as (step, loss) lists
c, d = (dict(read_log(sys.argv[1] + f"/{r}/log.txt")[1]) for r in ("control", "delta"))
steps = sorted(set(c) & set(d))
fig, ax = plt.subplots(figsize=(8, 4.5))
ax.plot(steps, [d[s] - c[s] for s in steps], "o-", color="tab:orange")
ax.axhline(0, color="gray", lw=0.8)
ax.set_xlabel("step after the conversion"); ax.set_ylabel("val loss: delta H=8 S=8 minus std control")
ax.set_title("The conversion's gain, val point by val point (below 0: delta is better)")
ax.grid(alpha=0.3); fig.tight_layout(); fig.savefig(sys.argv[1] + "/loss_difference.png.tmp.png", dpi=100)
import os; os.rename(sys.argv[1] + "/loss_difference.png.tmp.png", sys.argv[1] + "/loss_difference.png")
print("wrote " + sys.argv[1] + "/loss_difference.png")
PY
    cat "$RESULTS/summary.md"
    exit 0
fi
[ $# -eq 0 ] || die "unknown argument '$1'; run it without arguments on the device, or with --report here"

bash dev/runs/study.sh --unpack
BIN=data/study.bin
DATA=(-i "$BIN/*_train_*.bin" -j "$BIN/*_val_*.bin" -tok data/study/tokenizer.bin)
if [ ! -x "$TRAINER" ] || ! "$TRAINER" -h > /dev/null 2>&1; then
    make -s -j"$(nproc)" "${TRAINER#./}" || die "make ${TRAINER#./} failed"
fi
read -r -a COMMON <<< "$SHAPE"
COMMON+=(-wd 0.1 -clip 1.0 -val_batches 32 -sample_every 0 -seed 1 -overwrite 1)
ARMS=(-n "$ARM" -lr "$ARM_LR" -warmup "$ARM_WARMUP" -lr_min 0.1 -val_every "$ARM_VAL")
mkdir -p "$RUNS"
echo "flags: common \`${COMMON[*]}\`; pre \`-r std -n $PRE -lr 5e-4 -warmup 100 -lr_min 0.1 -val_every 50\`; arms \`${ARMS[*]}\` with \`-r std\` and \`-r delta -H 8 -S 8\`, both \`-init_from pre/ckpt_$(printf %06d "$PRE").bin\`" > "$RUNS/flags.txt"
run() {   # NAME FLAGS...: one run into RUNS/NAME, its stdout kept beside its log
    local name=$1; shift
    local t0=$SECONDS
    local rc=0
    "$TRAINER" "${COMMON[@]}" "${DATA[@]}" "$@" -o "$RUNS/$name" > "$RUNS/$name.stdout.txt" 2>&1 || rc=$?
    [ $rc -eq 0 ] || { tail -n 5 "$RUNS/$name.stdout.txt"; die "the $name run failed (exit $rc)"; }
    echo "delta_experiment: $name done in $((SECONDS - t0)) s: $(awk '$3 == "val_loss" {v = $4} END {print "val loss " v}' "$RUNS/$name/log.txt")"
}
run pre -r std -n "$PRE" -lr 5e-4 -warmup 100 -lr_min 0.1 -val_every 50
CKPT=$RUNS/pre/ckpt_$(printf %06d "$PRE").bin
run control -r std -init_from "$CKPT" "${ARMS[@]}"
run delta -r delta -H 8 -S 8 -init_from "$CKPT" "${ARMS[@]}"
for r in control delta; do   # the first step's loss: equal in both arms (the identity at conversion)
    echo "delta_experiment: $r first step: $(grep -m1 '^step ' "$RUNS/$r.stdout.txt")"
done
tar -czf "$RUNS/delta_results.tar.gz" -C "$RUNS" flags.txt pre/log.txt control/log.txt delta/log.txt \
    pre.stdout.txt control.stdout.txt delta.stdout.txt
if [ -n "${OUT:-}" ]; then cp "$RUNS/delta_results.tar.gz" "$OUT/"; fi
echo "delta_experiment: packed $RUNS/delta_results.tar.gz; unpack it into $RESULTS/ and run --report"
