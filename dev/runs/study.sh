#!/usr/bin/env bash
# The multi-seed comparison (std, hc, attnres, mhar H=4/8/16, block mhar), one chunk per
# device command. The matrix (run names, seeds, flags, and the flags every run shares) is
# dev/runs/study_matrix.txt; results are the run logs under dev/results/study/<run>/.
#
#   here, once:      bash dev/runs/study.sh --prepare      data/study/: xz shards (carry data/study)
#   on the device:   bash dev/runs/study.sh [--budget S] [--next K] [--only REGEX]
#                    runs the next unfinished runs of the matrix, in its order, while they fit
#                    S seconds (default 520, counted from the script's start); K caps their count
#   anywhere:        bash dev/runs/study.sh --status       done / pending, and the chunks still needed
#                    bash dev/runs/study.sh --dry-run      what the next chunk would run
#   on the device:   bash dev/runs/study.sh --probe        probe every routed checkpoint under runs/study
#                    bash dev/runs/study.sh --unpack       only decompress the shards into BIN (for other scripts)
#
# Done means: dev/results/study/<run>/log.txt exists (committed) or runs/study/<run>/log.txt
# reaches the last step's val loss (same machine, earlier call). Runs finish inside one call:
# a run cut short (by the deadline, a crash, a lost machine) is deleted and restarts from step 0
# in a later chunk. Its checkpoints could not travel (0.8 GB each, the device is bare each call)
# and a run is at most a few minutes, so restarting costs less than the bookkeeping of resuming.
#
# Every run writes runs/study/<run>/{log.txt,train.txt,ckpt_<last>.bin}; attnres and mhar runs
# are probed on the CPU right after they finish (dev/route_probe, in the background while the
# next run trains): probe.txt, probe.csv (routing weights, JS between heads), probe_width.csv
# (KL width disagreement, SPEC section 10). The finished runs' small files are packed into
# runs/study/study_results.tar.gz and, when OUT is set, copied to $OUT together with
# $OUT/chunk.txt (what ran, wall times, failures). Unpack into dev/results/study/ and commit.
#
# Environment: MATRIX, RESULTS (dev/results/study), RUNS (runs/study), DATA (data/study: the
# .xz shards, carried), BIN (data/study.bin: where they are decompressed, on the device),
# TRAINER (./train_mhar_cu; built with make when missing), BASE_TPS (600000: std tokens/s, for
# the estimates), STARTUP_S (12: per-run start and the final checkpoint), HARD_S (560: runs are
# killed so that packing ends before the device's 600 s), PROBE_FLAGS ("-b 4 -n 4 -t 1024").
set -euo pipefail
cd "$(dirname "$0")/../.."
MATRIX=${MATRIX:-dev/runs/study_matrix.txt}
RESULTS=${RESULTS:-dev/results/study}
RUNS=${RUNS:-runs/study}
DATA=${DATA:-data/study}
TRAINER=${TRAINER:-./train_mhar_cu}
BASE_TPS=${BASE_TPS:-600000}
STARTUP_S=${STARTUP_S:-12}
HARD_S=${HARD_S:-560}
PROBE_FLAGS=${PROBE_FLAGS:--b 4 -n 4 -t 1024}
PROBE_THREADS=${PROBE_THREADS:-$(( $(nproc) > 4 ? $(nproc) - 4 : 1 ))}
die() { echo "study: error: $*" >&2; exit 1; }

# ------------------------------------------------------------------ data (here, once)
# The Linux 6.1 source (.c .h .rst, data_prep/fetch.sh large), without the 253 files over
# 256 KiB: those are generated register headers (amdgpu's asic_reg and the like), 427 MB of
# the 1.2 GB, each millions of tokens of #define lines that would fill a whole val split or a
# long stretch of training alone. The rest is tokenised in a random file order (--shuffle 1337),
# 2.5% of the files held out as val; the study keeps the first TRAIN_TOKENS train tokens and
# the first VAL_TOKENS val tokens (val files are never train files), xz-compressed.
if [ "${1:-}" = --prepare ]; then
    TRAIN_TOKENS=${TRAIN_TOKENS:-80000000} VAL_TOKENS=${VAL_TOKENS:-2000000}
    [ -f data/raw/linux/.done ] || data_prep/fetch.sh large
    make -s data_prep/tokenize data/vocab/r50k_base.tiktoken
    if [ ! -f data/study_tok/.done ]; then
        rm -rf data/study_src data/study_tok
        mkdir -p data/study_src
        cp -al data/raw/linux/linux-source-6.1 data/study_src/   # hard links: no copy
        find data/study_src -type f -size +256k -delete
        # 200 MB of text is about 100M tokens: enough for both splits, in a few minutes
        ./data_prep/tokenize -o data/study_tok --pattern '*.c' --pattern '*.h' --pattern '*.rst' \
            --shuffle 1337 --val-fraction 0.025 --max-bytes 200000000 data/study_src
        touch data/study_tok/.done
    fi
    mkdir -p data/study
    /usr/bin/python3 - "$TRAIN_TOKENS" "$VAL_TOKENS" <<'PY'
import glob, lzma, os, shutil, struct, sys
def take(pattern, n, out):
    body = bytearray()
    for path in sorted(glob.glob(pattern)):
        with open(path, 'rb') as f:
            magic, version, count = struct.unpack('<3i', f.read(12))
            assert (magic, version) == (20240520, 1), f"{path}: not a uint16 shard"
            f.seek(1024)
            body += f.read(2 * min(count, n - len(body) // 2))
        if len(body) // 2 >= n: break
    if len(body) // 2 < n: sys.exit(f"study: error: {pattern} holds {len(body) // 2} tokens, fewer than {n}; raise --max-bytes in --prepare")
    header = struct.pack('<256i', *([20240520, 1, n] + [0] * 253))
    with lzma.open(out + '.tmp', 'wb', preset=9 | lzma.PRESET_EXTREME) as f: f.write(header + bytes(body))
    os.rename(out + '.tmp', out)
    print(f"{out}: {n} tokens, {os.path.getsize(out) / 2**20:.1f} MiB")
take('data/study_tok/data_train_*.bin', int(sys.argv[1]), 'data/study/study_train_000000.bin.xz')
take('data/study_tok/data_val_*.bin', int(sys.argv[2]), 'data/study/study_val_000000.bin.xz')
shutil.copy('data/study_tok/tokenizer.bin', 'data/study/tokenizer.bin')
PY
    (cd data/study && sha256sum ./*.xz tokenizer.bin)
    exit 0
fi

# ------------------------------------------------------------------ flags
MODE=chunk NEXT=0 BUDGET=520 ONLY=.
while [ $# -gt 0 ]; do
    case $1 in
        --next) NEXT=${2:?--next needs a count}; shift 2 ;;
        --budget) BUDGET=${2:?--budget needs seconds}; shift 2 ;;
        --only) ONLY=${2:?--only needs a regular expression}; shift 2 ;;
        --status) MODE=status; shift ;;
        --dry-run) MODE=dry; shift ;;
        --probe) MODE=probe; shift ;;
        --unpack) MODE=unpack; shift ;;
        -h|--help) awk 'NR > 1 && /^set / {exit} NR > 1' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument '$1'; use --prepare, --next K, --budget S, --only REGEX, --status, --dry-run, --probe or --unpack" ;;
    esac
done
[[ $NEXT =~ ^[0-9]+$ ]] || die "--next '$NEXT' is not a count; give a whole number (0 = no cap)"
[[ $BUDGET =~ ^[0-9]+$ ]] || die "--budget '$BUDGET' is not seconds; give a whole number"

# ------------------------------------------------------------------ the matrix
[ -f "$MATRIX" ] || die "$MATRIX not found; set MATRIX or restore dev/runs/study_matrix.txt"
COMMON="" NAMES=() SEEDS=() SPEEDS=() FLAGS=()
while read -r name rest; do
    case $name in ''|'#'*) continue ;; esac
    if [ "$name" = common ]; then COMMON=$rest; continue; fi
    read -r seed speed flags <<< "$rest"
    [[ $seed =~ ^[0-9]+$ ]] || die "$MATRIX: run $name has seed '$seed'; want: NAME SEED SPEED FLAGS..."
    [[ $speed =~ ^[0-9]*\.?[0-9]+$ ]] || die "$MATRIX: run $name has speed '$speed'; want a number like 0.87"
    for n in "${NAMES[@]}"; do [ "$n" != "$name" ] || die "$MATRIX: run $name appears twice"; done
    NAMES+=("$name"); SEEDS+=("$seed"); SPEEDS+=("$speed"); FLAGS+=("$flags")
done < "$MATRIX"
[ -n "$COMMON" ] || die "$MATRIX has no 'common FLAGS...' line"
[ ${#NAMES[@]} -gt 0 ] || die "$MATRIX lists no runs"
# shared settings the script needs: steps, tokens per step, val schedule (from the common flags)
flag() { awk -v f="-$1" -v d="$2" '{for (i = 1; i < NF; i++) if ($i == f) v = $(i + 1)} END {print (v == "" ? d : v)}' <<< "$COMMON"; }
STEPS=$(flag n 200) SEQ_T=$(flag T 0) PRESET=$(flag preset tiny)
if [ "$SEQ_T" = 0 ]; then case $PRESET in 100m) SEQ_T=2048 ;; 350m|1b) SEQ_T=1024 ;; test) SEQ_T=16 ;; *) SEQ_T=128 ;; esac; fi
MICRO=$(flag b 8) TOK_STEP=$(flag d 0) VAL_EVERY=$(flag val_every 50) VAL_BATCHES=$(flag val_batches 8)
[ "$TOK_STEP" != 0 ] || TOK_STEP=$((MICRO * SEQ_T))

# finished LOG: the log reaches the last step's val loss
finished() { [ -f "$1" ] && awk -v n="$STEPS" '$1 == "step" && $2 == n && $3 == "val_loss" {f = 1} END {exit !f}' "$1"; }
state() {   # done (committed), here (finished on this machine), todo
    if [ -f "$RESULTS/$1/log.txt" ]; then echo done
    elif finished "$RUNS/$1/log.txt"; then echo here
    else echo todo; fi
}
CAL=1.0   # measured / estimated wall time of the runs timed in this call
estimate() {   # seconds for a run of relative speed $1: training, validation, start and checkpoint
    awk -v s="$1" -v cal="$CAL" -v base="$BASE_TPS" -v steps="$STEPS" -v ts="$TOK_STEP" -v ve="$VAL_EVERY" \
        -v vb="$VAL_BATCHES" -v mb="$MICRO" -v T="$SEQ_T" -v st="$STARTUP_S" 'BEGIN {
        tps = base * s; nval = int(steps / ve) + (steps % ve != 0)
        printf "%d", cal * (steps * ts / tps + nval * vb * mb * T / (3 * tps)) + st + 0.5 }'
}
routed() { [[ " $1 " =~ " -r "(mhar|attnres)" " ]]; }

if [ "$MODE" = status ] || [ "$MODE" = dry ]; then
    ndone=0 left=0 chunks=0 used=$BUDGET total=0
    for k in "${!NAMES[@]}"; do
        s=$(state "${NAMES[$k]}") e=$(estimate "${SPEEDS[$k]}")
        [ "$MODE" = status ] && printf '%-14s seed %-3s %-5s ~%4d s  %s\n' "${NAMES[$k]}" "${SEEDS[$k]}" "$s" "$e" "${FLAGS[$k]}"
        if [ "$s" != todo ]; then ndone=$((ndone + 1)); continue; fi
        [[ ${NAMES[$k]} =~ $ONLY ]] || continue
        # pack the pending runs, in order, into chunks of BUDGET seconds
        if [ $((used + e)) -gt "$BUDGET" ]; then chunks=$((chunks + 1)); used=0; fi
        used=$((used + e)); left=$((left + 1)); total=$((total + e))
        [ "$MODE" = dry ] && [ "$chunks" -le 1 ] && printf 'next chunk: %-14s ~%d s (ends at ~%d s)\n' "${NAMES[$k]}" "$e" "$used"
    done
    echo "study: ${ndone} of ${#NAMES[@]} runs done; $left pending, ~$total s of training: $chunks chunks of at most $BUDGET s"
    echo "study: $STEPS steps x $TOK_STEP tokens = $((STEPS * TOK_STEP)) tokens per run"
    exit 0
fi

# ------------------------------------------------------------------ on the device
# the shards are decompressed beside the carried folder, not into it: a carried data/study
# must hold only the .xz files (the 64 MiB limit), so a .bin left in it would block the next carry
BIN=${BIN:-$DATA.bin}
mkdir -p "$BIN"
for f in "$DATA"/*.xz; do
    [ -f "$f" ] || die "no $DATA/*.xz; make them here with: bash dev/runs/study.sh --prepare (and carry $DATA)"
    b=$BIN/$(basename "${f%.xz}")
    [ -f "$b" ] || /usr/bin/env python3 -c "import lzma, os, shutil, sys
with lzma.open(sys.argv[1]) as i, open(sys.argv[2] + '.tmp', 'wb') as o: shutil.copyfileobj(i, o, 1 << 24)
os.rename(sys.argv[2] + '.tmp', sys.argv[2])" "$f" "$b"
done
DATA_FLAGS=(-i "$BIN/*_train_*.bin" -j "$BIN/*_val_*.bin")
[ ! -f "$DATA/tokenizer.bin" ] || DATA_FLAGS+=(-tok "$DATA/tokenizer.bin")
if [ "$MODE" = unpack ]; then echo "study: shards in $BIN: $(ls "$BIN"/*.bin | tr '\n' ' ')"; exit 0; fi
mkdir -p "$RUNS"
rm -f "$RUNS/study_results.tar.gz"   # never hand back a previous call's pack
make -s dev/route_probe > "$RUNS/make_probe.txt" 2>&1 &
PROBE_BUILD=$!
LOG=$RUNS/chunk.txt
: > "$LOG"
say() { echo "study: $*" | tee -a "$LOG"; }

# probe CKPT DIR: the routing probe of one finished attnres/mhar run, on the CPU, in the background
PROBES=()
probe() {
    local left=$((HARD_S - SECONDS - 5))
    [ "$left" -gt 10 ] || { say "no time left to probe $2"; return; }
    if [ -n "$PROBE_BUILD" ]; then   # the build started with the chunk; long done by now
        wait "$PROBE_BUILD" || say "make dev/route_probe failed: $(tail -n 2 "$RUNS/make_probe.txt" | tr '\n' ' ')"
        PROBE_BUILD=""
    fi
    # shellcheck disable=SC2086
    (OMP_NUM_THREADS=$PROBE_THREADS timeout "$left" nice ./dev/route_probe -c "$1" \
        -j "$BIN/*_val_*.bin" $PROBE_FLAGS -o "$2/probe.csv" -k "$2/probe_width.csv" > "$2/probe.txt" 2>&1 ||
        echo "probe failed (exit $?)" >> "$2/probe.txt") &
    PROBES+=($!)
}

if [ "$MODE" = probe ]; then
    for k in "${!NAMES[@]}"; do
        d=$RUNS/${NAMES[$k]}
        routed "${FLAGS[$k]}" && finished "$d/log.txt" || continue
        ck=$(ls "$d"/ckpt_*.bin 2>/dev/null | tail -1)
        [ -n "$ck" ] || continue
        say "probing ${NAMES[$k]} ($ck)"
        probe "$ck" "$d"
        for p in "${PROBES[@]}"; do wait "$p" || true; done   # one at a time: each takes most cores
        PROBES=()
    done
else
    # a carried binary that cannot load here (another CUDA major version) is rebuilt too
    if [ ! -x "$TRAINER" ] || ! "$TRAINER" -h > /dev/null 2>&1; then
        say "$TRAINER missing or not loadable ($( ("$TRAINER" -h 2>&1 || true) | tail -n 1)): building it (make -j$(nproc), a few minutes of the budget)"
        rm -f "$TRAINER"
        make -s -j"$(nproc)" "${TRAINER#./}" >> "$LOG" 2>&1 || die "make ${TRAINER#./} failed (see $LOG)"
    fi
    say "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || echo 'no nvidia-smi'); budget $BUDGET s, hard stop $HARD_S s"
    ran=0
    for k in "${!NAMES[@]}"; do
        name=${NAMES[$k]} d=$RUNS/${NAMES[$k]}
        [ "$(state "$name")" = todo ] || continue
        [[ $name =~ $ONLY ]] || continue
        [ "$NEXT" = 0 ] || [ "$ran" -lt "$NEXT" ] || break
        e=$(estimate "${SPEEDS[$k]}")
        if [ $((SECONDS + e)) -gt "$BUDGET" ] || [ $((SECONDS + e)) -gt "$HARD_S" ]; then
            say "stop: $name needs ~$e s, $((BUDGET - SECONDS)) s left of the budget $BUDGET (hard stop $HARD_S)"; break
        fi
        rm -rf "$d"; mkdir -p "$d"   # a run cut short before restarts from step 0
        t0=$SECONDS
        # shellcheck disable=SC2086
        set +e
        timeout --kill-after=5 $((HARD_S - SECONDS)) "$TRAINER" $COMMON -seed "${SEEDS[$k]}" ${FLAGS[$k]} "${DATA_FLAGS[@]}" \
            -o "$d" > "$d/stdout.txt" 2>&1
        rc=$?
        set -e
        wall=$((SECONDS - t0)); ran=$((ran + 1))
        if [ $rc -ne 0 ] || ! finished "$d/log.txt"; then
            why="exit $rc"
            [ $rc -ne 124 ] && [ $rc -ne 137 ] || why="cut at the hard stop $HARD_S s: it restarts in a later chunk"
            say "FAILED $name ($why, after $wall s, estimate $e s); its last lines:"
            tail -n 4 "$d/stdout.txt" | sed 's/^/    /' | tee -a "$LOG"
            rm -f "$d"/ckpt_*.bin
            continue
        fi
        grep -v '^step' "$d/stdout.txt" > "$d/train.txt" || true
        rm -f "$d/stdout.txt"
        say "done $name in $wall s (estimate $e s): $(awk '$3 == "val_loss" {v = $4} END {print "final val loss " v}' "$d/log.txt")"
        # measured / estimated, from runs long enough to tell (kept within 0.3 .. 5)
        CAL=$(awk -v c="$CAL" -v w="$wall" -v e="$e" -v st="$STARTUP_S" 'BEGIN {
            if (e - st < 10) { printf "%.3f", c; exit }
            r = (w - st) / (e - st) * c; printf "%.3f", (r < 0.3 ? 0.3 : (r > 5 ? 5 : r)) }')
        if routed "${FLAGS[$k]}"; then probe "$(ls "$d"/ckpt_*.bin | tail -1)" "$d"; fi
    done
fi
for p in "${PROBES[@]}"; do wait "$p" || true; done

# ------------------------------------------------------------------ pack the finished runs
LIST=()
for k in "${!NAMES[@]}"; do
    name=${NAMES[$k]}
    finished "$RUNS/$name/log.txt" || continue
    for f in log.txt train.txt probe.txt probe.csv probe_width.csv; do
        [ -f "$RUNS/$name/$f" ] && LIST+=("$name/$f")
    done
done
if [ ${#LIST[@]} -gt 0 ]; then
    tar -czf "$RUNS/study_results.tar.gz" -C "$RUNS" "${LIST[@]}"
    say "packed $(printf '%s\n' "${LIST[@]}" | grep -c '/log.txt$') finished runs into $RUNS/study_results.tar.gz ($(stat -c %s "$RUNS/study_results.tar.gz") bytes); unpack into $RESULTS/"
else
    say "no finished runs to pack"
fi
say "wall $SECONDS s"
if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    [ ! -f "$RUNS/study_results.tar.gz" ] || cp "$RUNS/study_results.tar.gz" "$OUT/"
    cp "$LOG" "$OUT/chunk.txt"
fi
