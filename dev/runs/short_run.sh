#!/usr/bin/env bash
# The short comparison of issue 6, sized for one 10-minute command on a 4-GPU
# machine: the 100M model on the Linux-kernel code corpus, std, attnres,
# mhar H=8 and mhar H=16 side by side (one GPU each), with equal tokens and
# equal seeds. Then the routing probe on the routed runs. Everything that comes
# back is packed into $ARCHIVE (logs, probe CSVs, summary.txt).
#
#   prepare once, here:   make data/large && bash dev/runs/short_run.sh --prepare
#   run on the device:    bash dev/runs/short_run.sh      (carry data/short)
#
# Environment: T (default 512), SEQS per step (64), B (64), LR (1e-3), STEPS (default: as many as
# fit BUDGET_S=330 seconds for the slowest mode, measured first), RUN_DIR (default runs/short),
# ARCHIVE (default RUN_DIR/short_run.tar.gz).
set -euo pipefail
cd "$(dirname "$0")/../.."

if [ "${1:-}" = --prepare ]; then
    # 80M train tokens as 2,441 windows of 32,768 tokens at random places of the whole
    # corpus, in random order: data_prep writes documents in path order, so contiguous
    # slices would feed one part of the kernel tree at a time and the val loss (documents
    # spread over the whole tree) would drift with the stream. Val: 61 random windows (2M tokens).
    # Both are xz-compressed so that they travel inside the 64 MiB working-tree limit.
    mkdir -p data/short
    /usr/bin/python3 - <<'PY'
import glob, lzma, random, shutil, struct
def header(n): return struct.pack('<256i', *([20240520, 1, n] + [0] * 253))
shards = sorted(glob.glob('data/large/*_train_*.bin'))
counts = [struct.unpack('<3i', open(s, 'rb').read(12))[2] for s in shards]
win, nwin = 32768, 80_000_000 // 32768
rng = random.Random(1337)
body = bytearray()
for _ in range(nwin):
    k = rng.choices(range(len(shards)), weights=counts)[0]
    off = rng.randrange(counts[k] - win)
    with open(shards[k], 'rb') as f:
        f.seek(1024 + 2 * off); body += f.read(2 * win)
open('data/short/short_train_000000.bin.xz', 'wb').write(lzma.compress(header(len(body) // 2) + bytes(body), preset=6))
val_all = open(glob.glob('data/large/*_val_*.bin')[0], 'rb').read()[1024:]
val = bytearray()
for _ in range(2_000_000 // win):   # the val documents are in path order too: random windows
    off = rng.randrange(len(val_all) // 2 - win)
    val += val_all[2 * off:2 * (off + win)]
open('data/short/short_val_000000.bin.xz', 'wb').write(lzma.compress(header(len(val) // 2) + bytes(val), preset=6))
shutil.copy('data/large/tokenizer.bin', 'data/short/tokenizer.bin')
PY
    ls -la data/short
    exit 0
fi

SEQS=${SEQS:-64} B=${B:-64} LR=${LR:-1e-3} RUN_DIR=${RUN_DIR:-runs/short} BUDGET_S=${BUDGET_S:-330}
TRAINER=${TRAINER:-./train_mhar_cu} PRESET=${PRESET:-100m} T=${T:-512}   # others for a CPU dry run
for f in data/short/*.xz; do [ -f "${f%.xz}" ] || python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$f" "${f%.xz}"; done
make -s "${TRAINER#./}" dev/route_probe
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l || true)
[ "$NGPU" -ge 1 ] || NGPU=1
[ "$NGPU" -ge 4 ] || echo "short_run: only $NGPU GPUs: runs will share them" >&2
mkdir -p "$RUN_DIR"
DATA_FLAGS=(-i 'data/short/*_train_*.bin' -j 'data/short/*_val_*.bin' -tok data/short/tokenizer.bin)
if [ -z "${STEPS:-}" ]; then
    # size the runs to BUDGET_S seconds: time 8 steps of the slowest mode (mhar H=16), skip 3
    TPS=$(CUDA_VISIBLE_DEVICES=0 $TRAINER -preset "$PRESET" -T "$T" -b "$B" -d $((SEQS * T)) -n 8 -warmup 1 \
          -r mhar -H 16 "${DATA_FLAGS[@]}" -j '' -sample_every 0 -val_every 0 2>&1 |
          awk -F'|' '/^step/ {split($6, a, " "); n++; if (n > 3) {s += a[1]; k++}} END {if (k) printf "%.0f", s / k}')
    STEPS=$(( BUDGET_S * ${TPS:-1000} / (SEQS * T) ))
    [ "$STEPS" -ge 20 ] || STEPS=20
    echo "short_run: slowest mode runs at ${TPS:-?} tok/s: $STEPS steps fit $BUDGET_S s"
fi
TOKENS=$((STEPS * SEQS * T))
echo "short_run: $PRESET model at T=$T, $STEPS steps x $SEQS x $T = $TOKENS tokens per run, peak lr $LR, seed 1337"
names=(std attnres mhar8 mhar16)
flags=("-r std" "-r attnres" "-r mhar -H 8" "-r mhar -H 16")
for k in 0 1 2 3; do
    CUDA_VISIBLE_DEVICES=$((k % NGPU)) $TRAINER -preset "$PRESET" -T "$T" -b "$B" -d $((SEQS * T)) -n "$STEPS" \
        -lr "$LR" -warmup $((STEPS / 10 + 1)) -seed 1337 ${flags[$k]} "${DATA_FLAGS[@]}" \
        -val_every $((STEPS / 4 + 1)) -val_batches 30 -sample_every 0 -o "$RUN_DIR/${names[$k]}" -overwrite 1 > "$RUN_DIR/${names[$k]}.out" 2>&1 &
done
wait
# the routing probe on the routed runs (CPU, T=512, 4 x 4 sequences)
for name in attnres mhar8 mhar16; do
    ck=$(ls "$RUN_DIR/$name"/ckpt_*.bin | tail -1)
    OMP_NUM_THREADS=$(( $(nproc) / 3 > 0 ? $(nproc) / 3 : 1 )) ./dev/route_probe -c "$ck" -j 'data/short/*_val_*.bin' \
        -b 4 -n 4 -t $((T < 512 ? T : 512)) -o "$RUN_DIR/probe_$name.csv" > "$RUN_DIR/probe_$name.txt" 2>&1 &
done
wait
{
    echo "$PRESET, $TOKENS tokens per run, final val loss (30 batches of $B x $T):"
    std=$(awk '/val_loss/ {v=$4} END {print v}' "$RUN_DIR/std/log.txt")
    for name in "${names[@]}"; do
        v=$(awk '/val_loss/ {v=$4} END {print v}' "$RUN_DIR/$name/log.txt")
        tps=$(awk '/train_loss/ {n++; if (n > 5) {s += $12; k++}} END {if (k) printf "%.0f", s / k}' "$RUN_DIR/$name/log.txt")
        awk -v n="$name" -v v="$v" -v s="$std" -v t="$tps" 'BEGIN {printf "  %-8s val %.4f  delta vs std %+.4f  %s tok/s\n", n, v, v - s, t}'
    done
    for name in "${names[@]}"; do echo "  $name: $(grep -h 'peak' "$RUN_DIR/$name.out" | tail -1)"; done
} | tee "$RUN_DIR/summary.txt"
tar -czf "${ARCHIVE:-$RUN_DIR/short_run.tar.gz}" -C "$RUN_DIR" summary.txt std/log.txt attnres/log.txt mhar8/log.txt mhar16/log.txt \
    std.out attnres.out mhar8.out mhar16.out probe_attnres.csv probe_mhar8.csv probe_mhar16.csv \
    probe_attnres.txt probe_mhar8.txt probe_mhar16.txt 2>/dev/null || true
