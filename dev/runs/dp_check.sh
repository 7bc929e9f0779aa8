#!/usr/bin/env bash
# Device checks of data-parallel training (common/dist.h) with train_mhar_cu.
#
#   bash dev/runs/dp_check.sh one     1 GPU: the NCCL path with one rank (MHAR_DIST=1) reproduces the
#                                     plain run bit for bit, bf16 and fp32 builds, a resume included
#   bash dev/runs/dp_check.sh two     2 GPUs: 2 ranks x B against 1 GPU accumulating over 2 x B,
#                                     20 steps; two 2-rank runs (mpirun, and the RANK/WORLD_SIZE
#                                     form) bit-identical; resumes on 2 ranks and on 1 GPU
#   bash dev/runs/dp_check.sh speed   2 GPUs: tokens/s of 100m and 350m on 1 and 2 GPUs (aim 1.9x)
#   bash dev/runs/dp_check.sh all     one, two and speed
#
# Environment: DATA  a folder of *_train_*.bin / *_val_*.bin shards (default: random tokens made
#                    here in WORK, 3 train shards of 150,000 tokens, so the runs cross shards)
#              WORK  scratch folder (default /tmp/mhar_dp_check)
#              PRESET, B  model and per-rank micro-batch of the correctness runs (default 100m, 4)
# Prints PASS/FAIL lines and ends with "N passed, N failed"; exits non-zero on a failure.
set -euo pipefail
cd "$(dirname "$0")/../.."
MODE=${1:-}
case $MODE in one|two|speed|all) ;; *) echo "usage: $0 one|two|speed|all" >&2; exit 1 ;; esac
WORK=${WORK:-/tmp/mhar_dp_check} PRESET=${PRESET:-100m} B=${B:-4}
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}   # NVLink multicast stays off
MPI=(dev/runs/mpi_launch.sh 2)
PASSED=0 FAILED=0
check() { if [ "$1" = 1 ]; then echo "PASS $2"; PASSED=$((PASSED + 1)); else echo "FAIL $2"; FAILED=$((FAILED + 1)); fi; }

make -s train_mhar_cu train_mhar_cu_fp32
for b in train_mhar_cu train_mhar_cu_fp32; do
    [[ $(ldd ./$b) == *libnccl* ]] || { echo "error: $b was built without NCCL (no nccl.h found): make clean-cuda, then make NCCL_HOME=..." >&2; exit 1; }
done
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l) || NGPU=0
if [ "$MODE" != one ] && [ "$NGPU" -lt 2 ]; then echo "error: '$MODE' needs 2 GPUs, this machine shows $NGPU" >&2; exit 1; fi

if [ -z "${DATA:-}" ]; then
    DATA=$WORK/data
    if [ ! -f "$DATA/r_val_000.bin" ]; then
        mkdir -p "$DATA"
        for i in 0 1 2; do python3 dev/make_shard.py "$DATA/r_train_00$i.bin" --tokens 150000 --seed "$i"; done
        python3 dev/make_shard.py "$DATA/r_val_000.bin" --tokens 100000 --seed 9
    fi
fi
case $PRESET in 100m) T=2048 ;; 350m|1b) T=1024 ;; test) T=16 ;; tiny) T=128 ;; *) echo "error: PRESET $PRESET unknown" >&2; exit 1 ;; esac
BT=$((B * T))
COMMON=(-preset "$PRESET" -r mhar -H 8 -n 20 -lr 1e-3 -warmup 5 -seed 1337 -i "$DATA/*_train_*.bin" -j "$DATA/*_val_*.bin"
        -val_every 10 -val_batches 3 -sample_every 20 -sample_len 8 -ckpt_every 10)

# a log without its timing fields (ms, tok_s): equal exactly when two runs agree bit for bit
numbers() { awk '$3 == "train_loss" {print $1, $2, $3, $4, $5, $6, $7, $8; next} {print}' "$1"; }
same_run() {   # dir dir: logs (without timing) and every checkpoint identical
    local a=$1 b=$2 ok=1
    diff <(numbers "$a/log.txt") <(numbers "$b/log.txt") >/dev/null || ok=0
    for c in "$a"/ckpt_*.bin; do cmp -s "$c" "$b/$(basename "$c")" || ok=0; done
    echo $ok
}
# largest relative difference of the losses (KEY: train_loss, the default, or val_loss) at the steps both logs have
maxrel() {
    awk -v key="${3:-train_loss}" '$3 != key {next} FNR == NR {v[$2] = $4; next} $2 in v {d = v[$2] - $4; if (d < 0) d = -d;
         r = d / ($4 < 0 ? -$4 : $4); if (r > m) m = r} END {printf "%.3e", m + 0}' "$1/log.txt" "$2/log.txt"
}
first_field() { awk -v key="$2" '$3 == key {print $4; exit}' "$1/log.txt"; }   # step 1's value
norm1() { awk '$3 == "train_loss" {print $8; exit}' "$1/log.txt"; }
rel() { awk -v a="$1" -v b="$2" 'BEGIN {d = a - b; if (d < 0) d = -d; printf "%.3e", d / (b < 0 ? -b : b)}'; }
le() { awk -v a="$1" -v b="$2" 'BEGIN {print (a <= b) ? 1 : 0}'; }

check_one() {
    for bin in train_mhar_cu train_mhar_cu_fp32; do
        local W=$WORK/one/$bin
        rm -rf "$W"; mkdir -p "$W"
        ./$bin "${COMMON[@]}" -b "$B" -d $((2 * BT)) -o "$W/plain" > "$W.plain.txt" 2>&1 || { cat "$W.plain.txt"; exit 1; }
        MHAR_DIST=1 ./$bin "${COMMON[@]}" -b "$B" -d $((2 * BT)) -o "$W/dist" > "$W.dist.txt" 2>&1 || { cat "$W.dist.txt"; exit 1; }
        local path=0; grep -q "^data-parallel: 1 rank from MHAR_DIST=1" "$W.dist.txt" && path=1
        check $path "$bin: MHAR_DIST=1 runs the NCCL path with one rank ($(grep -m1 '^data-parallel' "$W.dist.txt" || echo 'no data-parallel line'))"
        check "$(same_run "$W/plain" "$W/dist")" "$bin: the one-rank NCCL run equals the plain run bit for bit (20 steps: log, checkpoints 10 and 20)"
        MHAR_DIST=1 ./$bin "${COMMON[@]}" -b "$B" -d $((2 * BT)) -resume "$W/dist/ckpt_000010.bin" -o "$W/resumed" > "$W.resumed.txt" 2>&1 || { cat "$W.resumed.txt"; exit 1; }
        local ok=1; cmp -s "$W/resumed/ckpt_000020.bin" "$W/plain/ckpt_000020.bin" || ok=0
        check $ok "$bin: resumed on the NCCL path at step 10, its step-20 checkpoint equals the plain run's"
    done
}

check_two() {
    for bin in train_mhar_cu_fp32 train_mhar_cu; do
        local W=$WORK/two/$bin D=$((4 * BT))
        rm -rf "$W"; mkdir -p "$W"
        ./$bin "${COMMON[@]}" -b "$B" -d $D -o "$W/accum" > "$W/accum.txt" 2>&1 || { cat "$W/accum.txt"; exit 1; }
        ./$bin "${COMMON[@]}" -b $((2 * B)) -d $D -o "$W/wide" > "$W/wide.txt" 2>&1 || { cat "$W/wide.txt"; exit 1; }
        MHAR_DIST_CHECK=1 "${MPI[@]}" ./$bin "${COMMON[@]}" -b "$B" -d $D -o "$W/dp" > "$W/dp.txt" 2>&1 || { cat "$W/dp.txt"; exit 1; }
        # the launcher-free form: each rank from RANK / WORLD_SIZE / LOCAL_RANK
        local pids=()
        for r in 0 1; do
            RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r ./$bin "${COMMON[@]}" -b "$B" -d $D -o "$W/env" > "$W/env.$r.txt" 2>&1 &
            pids+=($!)
        done
        for pid in "${pids[@]}"; do wait "$pid" || { cat "$W"/env.*.txt; exit 1; }; done
        "${MPI[@]}" ./$bin "${COMMON[@]}" -b "$B" -d $D -resume "$W/dp/ckpt_000010.bin" -o "$W/dp_resumed" > "$W/dp_resumed.txt" 2>&1 || { cat "$W/dp_resumed.txt"; exit 1; }
        ./$bin "${COMMON[@]}" -b "$B" -d $D -resume "$W/dp/ckpt_000010.bin" -o "$W/one_resumed" > "$W/one_resumed.txt" 2>&1 || { cat "$W/one_resumed.txt"; exit 1; }

        check "$(grep -c '^step     1/' "$W/dp.txt" | awk '{print ($1 == 1) ? 1 : 0}')" "$bin: 2 ranks print one copy of each step line (rank 0 only)"
        local l1a l1d n1a n1d
        l1a=$(first_field "$W/accum" train_loss) l1d=$(first_field "$W/dp" train_loss)
        n1a=$(norm1 "$W/accum") n1d=$(norm1 "$W/dp")
        check "$([ "$l1a" = "$l1d" ] && echo 1 || echo 0)" "$bin: step 1 loss of 2 ranks x 2 micro-batches = 1 GPU x 4, exactly ($l1d vs $l1a)"
        local dn; dn=$(awk -v a="$n1d" -v b="$n1a" 'BEGIN {d = a - b; print (d <= 1e-4 && d >= -1e-4) ? 1 : 0}')
        check "$dn" "$bin: step 1 gradient norm of 2 ranks = 1 GPU to the log's 4 decimals, up to one unit (fp32 summation order): $n1d vs $n1a"
        # drift over 20 steps, against the floor of the same arithmetic in another order: 1 GPU with 2B x 2
        # (its val batches hold 2B sequences, other data: only its train losses count)
        local floor drift vdrift tol
        floor=$(maxrel "$W/wide" "$W/accum") drift=$(maxrel "$W/dp" "$W/accum") vdrift=$(maxrel "$W/dp" "$W/accum" val_loss)
        tol=$(awk -v f="$floor" 'BEGIN {t = 10 * f; if (t < 1e-6) t = 1e-6; if (t > 1e-2) t = 1e-2; printf "%.3e", t}')
        check "$(le "$drift" "$tol")" "$bin: 20 steps, train losses of 2 ranks vs 1 GPU accumulating: max rel $drift <= $tol (10 x the reordering floor $floor of 1 GPU b=2B vs b=B, within [1e-6, 1e-2])"
        check "$(le "$vdrift" "$tol")" "$bin: val losses (3 batches: 2 on rank 0, 1 on rank 1) of 2 ranks vs 1 GPU: max rel $vdrift <= $tol"
        check "$(same_run "$W/dp" "$W/env")" "$bin: two 2-rank runs (mpirun; RANK/WORLD_SIZE) are bit-identical (log, checkpoints 10 and 20)"
        local ok=1; cmp -s "$W/dp_resumed/ckpt_000020.bin" "$W/dp/ckpt_000020.bin" || ok=0
        check $ok "$bin: a 2-rank run resumed at step 10 on 2 ranks ends bit-identical"
        local dr; dr=$(maxrel "$W/one_resumed" "$W/dp")
        # (its log holds steps 11..20 only)
        check "$(le "$dr" "$tol")" "$bin: the 2-rank checkpoint resumed on 1 GPU (accumulating over 4) follows the 2-rank run: max rel $dr <= $tol"
    done
}

# median tokens/s of steps 4.. of a trainer's stdout
toks() {
    awk -F'|' '/^step/ {n++; if (n > 3) {split($6, a, " "); print a[1]}}' "$1" | sort -n |
        awk '{v[NR] = $1} END {print (NR ? v[int((NR + 1) / 2)] : 0)}'
}

check_speed() {
    local W=$WORK/speed
    rm -rf "$W"; mkdir -p "$W"
    # the run scripts' batches: 100m 64 x 2048 tokens, 350m 32 x 1024, per-GPU micro-batch 16
    for spec in "100m 2048 64" "350m 1024 32"; do
        local p t seqs
        read -r p t seqs <<< "$spec"
        local F=(-preset "$p" -r mhar -H 8 -b 16 -d $((seqs * t)) -n 12 -warmup 2 -i "$DATA/*_train_*.bin" -j '' -sample_every 0)
        ./train_mhar_cu "${F[@]}" > "$W/$p.1.txt" 2>&1 || { cat "$W/$p.1.txt"; exit 1; }
        "${MPI[@]}" ./train_mhar_cu "${F[@]}" > "$W/$p.2.txt" 2>&1 || { cat "$W/$p.2.txt"; exit 1; }
        local t1 t2 s
        t1=$(toks "$W/$p.1.txt") t2=$(toks "$W/$p.2.txt")
        s=$(awk -v a="$t2" -v b="$t1" 'BEGIN {printf "%.2f", a / b}')
        echo "speed $p: 1 GPU $t1 tok/s, 2 GPUs $t2 tok/s: ${s}x (all-reduce per step: $(grep -m1 '^parameters' "$W/$p.1.txt"), x4 bytes)"
        check "$(le 1.9 "$s")" "$p bf16: 2 GPUs run ${s}x the tokens/s of 1 (aim 1.9x)"
    done
}

case $MODE in
    one) check_one ;;
    two) check_two ;;
    speed) check_speed ;;
    all) check_one; check_two; check_speed ;;
esac
echo "$PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ]
