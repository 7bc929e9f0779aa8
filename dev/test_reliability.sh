#!/usr/bin/env bash
# Bad input, divergence and checkpoint safety of a CPU trainer binary (make test runs it
# through the AddressSanitizer + UBSan build, train_mhar_asan):
#   bash dev/test_reliability.sh [./train_mhar_asan]
# Every bad flag or file must give a non-zero exit and exactly one line on stderr naming
# the problem (a sanitizer report is more lines, so it fails too); a run that goes
# non-finite must stop before saving non-finite weights; checkpoints carry a checksum;
# a fresh run never mixes into an old run's directory. (Whole UTF-8 characters in samples:
# test_mhar.c.) Ends with "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-./train_mhar_asan}
[ -x "$BIN" ] || { echo "error: $BIN not found; fix: make ${BIN#./}"; echo "0 passed, 1 failed"; exit 1; }
PY=/usr/bin/python3
W=$(mktemp -d /tmp/mhar_rel_XXXXXX)
trap 'rm -rf "$W"' EXIT
# a sanitizer finding must not look like die()'s exit 1
export ASAN_OPTIONS=exitcode=86:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:exitcode=87
# one thread: the runs are tiny, and OpenMP's spinning threads slow a sanitized build on a busy machine
export OMP_NUM_THREADS=1
pass=0; fail=0
ok() { echo "PASS $*"; pass=$((pass + 1)); }
bad() { echo "FAIL $*"; fail=$((fail + 1)); }

# shards of the learnable sequence of test_mhar.c (vocab 61) and a small tokenizer file
$PY - "$W" <<'EOF'
import struct, sys
w = sys.argv[1]
def shard(path, n):
    toks = [60 if i % 64 == 0 else (i * 7) % 17 + 1 for i in range(n)]
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)) + struct.pack(f"<{n}H", *toks))
shard(f"{w}/train.bin", 20000)
def tokfile(path, tokens, eot):
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 0x4B54484D, 1, len(tokens), eot, *([0] * 252)))
        for t in tokens:
            f.write(struct.pack("<I", len(t)) + t)
# 100 tokens, EOT 99: outside a V=61 model (the audit's -V 61 with GPT-2's tokenizer)
tokfile(f"{w}/tok100.bin", [b"t%d" % i for i in range(99)] + [b"<|endoftext|>"], 99)
# 61 tokens, EOT 60
tokfile(f"{w}/tok61.bin", [b"t%d " % i for i in range(60)] + [b"<|endoftext|>"], 60)
EOF

run() { "$BIN" -preset test -V 61 -b 4 -i "$W/train.bin" -j '' -sample_every 0 "$@"; }

# expect_fail NAME SUBSTRING ARGS...: non-zero exit (not a sanitizer's), one stderr line containing SUBSTRING
expect_fail() {
    local name=$1 want=$2; shift 2
    run "$@" >"$W/out.txt" 2>"$W/err.txt"; local rc=$?
    local lines; lines=$(wc -l <"$W/err.txt")
    if [ $rc -ne 0 ] && [ $rc -ne 86 ] && [ $rc -ne 87 ] && [ $rc -lt 128 ] && [ "$lines" -eq 1 ] && grep -qF -- "$want" "$W/err.txt"; then
        ok "$name: exit $rc, $(cat "$W/err.txt")"
    else
        bad "$name: exit $rc, $lines stderr lines, want one containing '$want':"; head -20 "$W/err.txt"
    fi
}

echo "== flags: strict integers, finite reals, ranges =="
expect_fail "-n 4294967297 (was 1 step)" "-n 4294967297 is out of range" -n 4294967297
expect_fail "-n 1e10 (was 1410065408 steps)" "-n '1e10' is not a whole number" -n 1e10
expect_fail "-n 2.5" "-n '2.5' is not a whole number" -n 2.5
expect_fail "-b 1e30 (was a float-cast overflow)" "-b '1e30' is not a whole number" -b 1e30
expect_fail "-sample_len -5 (asked for 18 EB)" "-sample_len -5 is out of range" -sample_len -5
expect_fail "-d -64 (trained on 0 micro-batches)" "-d -64 is out of range" -d -64
expect_fail "-d 100 not a multiple of b*T" "-d 100 is not a multiple of b*T = 64" -d 100
expect_fail "-val_batches 0 (printed a NaN val loss)" "-val_batches 0 is out of range" -val_batches 0
expect_fail "-clip -1" "-clip -1 is out of range" -clip -1
expect_fail "-beta1 2" "-beta1 2 is out of range" -beta1 2
expect_fail "-beta2 1" "-beta2 1 is out of range" -beta2 1
expect_fail "-warmup -5" "-warmup -5 is out of range" -warmup -5
expect_fail "-ckpt_every -1" "-ckpt_every -1 is out of range" -ckpt_every -1
expect_fail "-init_std -1" "-init_std -1 is out of range" -init_std -1
expect_fail "-S 100 (L=2: 4 sublayers)" "S=100 sublayers per block is out of range" -S 100
expect_fail "-V 2147483647 (overflowed Vp)" "-V 2147483647 is out of range" -V 2147483647
expect_fail "-lr nan" "-lr 'nan' is not a finite number" -lr nan
expect_fail "-lr inf" "-lr 'inf' is not a finite number" -lr inf
expect_fail "-lr -1" "-lr -1 is out of range" -lr -1
expect_fail "-eps 0 (0/0 in AdamW)" "-eps 0 is out of range" -eps 0
expect_fail "-seed -1" "-seed '-1' is not an integer" -seed -1
expect_fail "-overwrite 2" "-overwrite 2 is out of range" -overwrite 2
expect_fail "-L 512" "-L 512 is out of range" -L 512
expect_fail "-op_times 2" "-op_times 2 is out of range" -op_times 2
expect_fail "-op_times 1 (the CUDA trainer's)" "the per-op GPU time table is the CUDA trainer's" -op_times 1
expect_fail "a directory as a shard" "is a directory, not a token shard" -i "$W"
expect_fail "-tok EOT id >= V (crashed in sampling)" "end-of-text id 99 is outside this model's vocabulary V=61" -tok "$W/tok100.bin" -n 1 -sample_every 1

echo "== a run that goes non-finite stops, keeps its last good checkpoint =="
expect_fail "-lr 1e6 diverges: stops naming the step" "stopping before the update" -lr 1e6 -n 20 -ckpt_every 1 -o "$W/div"
nonfinite_saved=0
for f in "$W"/div/ckpt_*.bin; do
    [ -e "$f" ] || continue
    "$BIN" -preset test -V 61 -b 4 -i "$W/train.bin" -j '' -sample_every 0 -n 50 -lr 1e-3 -resume "$f" -o "$W/div_resume_$(basename "$f")" >/dev/null 2>"$W/err.txt" \
        || { grep -q "non-finite" "$W/err.txt" && nonfinite_saved=1; }
done
ls "$W"/div/*.tmp >/dev/null 2>&1 && nonfinite_saved=1
step=$(sed -n 's/.*step \([0-9]*\): the .*/\1/p' "$W/err.txt" 2>/dev/null | head -1)
nck=$(ls "$W"/div/ckpt_*.bin 2>/dev/null | wc -l)
if [ $nonfinite_saved -eq 0 ] && [ "$(grep -c . "$W/div/log.txt")" -ge 1 ]; then
    ok "after the divergence: $nck checkpoints, all finite and resumable with a sane -lr; no .tmp left"
else
    bad "after the divergence: a non-finite checkpoint or a .tmp was left in $W/div"; ls -la "$W/div"
fi

# a checkpoint to patch: 5 steps
run -n 5 -o "$W/a" >/dev/null 2>&1 || bad "a 5-step run"
CK="$W/a/ckpt_000005.bin"
patch_ckpt() {   # patch_ckpt IN OUT VERSION [INT_INDEX INT_VALUE] [FLOAT_INDEX FLOAT_VALUE]: header ints / a tensor value
    $PY - "$@" <<'EOF'
import struct, sys
src, dst, version = sys.argv[1], sys.argv[2], int(sys.argv[3])
b = bytearray(open(src, "rb").read())
rest = sys.argv[4:]
while rest:
    kind, idx, val = rest[0], int(rest[1]), rest[2]
    rest = rest[3:]
    if kind == "int":
        b[4 * idx:4 * idx + 4] = struct.pack("<i", int(val))
    else:
        b[1024 + 4 * idx:1024 + 4 * idx + 4] = struct.pack("<f", float(val))
b[4:8] = struct.pack("<i", version)
if version == 1:
    b[120:124] = b"\0\0\0\0"   # version 1 has no checksum
open(dst, "wb").write(bytes(b))
EOF
}
resume() { run -n 8 -resume "$@"; }

echo "== checkpoint headers and bodies =="
patch_ckpt "$CK" "$W/neg.bin" 1 int 15 -10
expect_fail "negative step (ran steps -9..6)" "header step -10" -n 8 -resume "$W/neg.bin"
patch_ckpt "$CK" "$W/min.bin" 1 int 15 -2147483648
expect_fail "step INT_MIN (ran 2^31 steps)" "header step -2147483648" -n 8 -resume "$W/min.bin"
patch_ckpt "$CK" "$W/bigV.bin" 1 int 2 2147483600
expect_fail "V near INT_MAX in a header (overflowed)" "sizes out of range (V=2147483600" -n 8 -resume "$W/bigV.bin"
patch_ckpt "$CK" "$W/nan.bin" 1 float 100 nan
expect_fail "a NaN weight (trained on NaN)" "parameter tensor wte holds a non-finite value at element 100" -n 8 -resume "$W/nan.bin"
patch_ckpt "$CK" "$W/inf_v.bin" 1 float $((19968 * 2 + 7)) inf
expect_fail "an inf in AdamW v" "AdamW v tensor wte holds a non-finite value at element 7" -n 8 -resume "$W/inf_v.bin"
patch_ckpt "$CK" "$W/flip.bin" 2 float 5000 0.123
expect_fail "a changed weight in a version-2 file" "checksum mismatch" -n 8 -resume "$W/flip.bin"
patch_ckpt "$CK" "$W/flipstep.bin" 2 int 15 4
expect_fail "a changed header field in a version-2 file" "checksum mismatch" -n 8 -resume "$W/flipstep.bin"
patch_ckpt "$CK" "$W/v3.bin" 3
expect_fail "version 3" "version 3; this build reads versions 1 and 2" -n 8 -resume "$W/v3.bin"
expect_fail "-n at or below the checkpoint's step" "is at step 5, and -n 5 leaves no step to train" -n 5 -resume "$CK"
patch_ckpt "$CK" "$W/v1.bin" 1
if resume "$W/v1.bin" -o "$W/v1run" >/dev/null 2>"$W/err.txt" && [ -f "$W/v1run/ckpt_000008.bin" ]; then
    ok "a version-1 checkpoint (no checksum) still resumes"
else bad "version-1 resume: $(head -3 "$W/err.txt")"; fi
h=$(od -A n -t x4 -j 4 -N 4 "$CK" | tr -d ' '); c=$(od -A n -t x4 -j 120 -N 4 "$CK" | tr -d ' ')
[ "$h" = 00000002 ] && [ "$c" != 00000000 ] && ok "new checkpoints are version 2 with a checksum (0x$c)" || bad "version $h, checksum $c"

echo "== the output directory =="
cp "$W/a/log.txt" "$W/log_before.txt"
expect_fail "a fresh run into a directory with a run" "already holds a run (log.txt, 1 checkpoint)" -n 3 -o "$W/a"
cmp -s "$W/a/log.txt" "$W/log_before.txt" && [ -f "$CK" ] && ok "the refused run left the old log and checkpoint as they were" \
    || bad "the refused run changed $W/a"
touch "$W/a/ckpt_000007.bin.tmp"
if resume "$CK" -o "$W/a" >"$W/out.txt" 2>"$W/err.txt" && grep -q "removed 1 stale temporary file (ckpt_\*.bin.tmp)" "$W/out.txt" \
   && [ ! -e "$W/a/ckpt_000007.bin.tmp" ] && [ "$(grep -c train_loss "$W/a/log.txt")" -eq 8 ]; then
    ok "-resume into its own directory: stale ckpt_*.bin.tmp removed with one line, log appended (8 steps)"
else bad "resume in place: $(head -3 "$W/err.txt")"; fi
if run -n 3 -o "$W/a" -overwrite 1 >"$W/out.txt" 2>"$W/err.txt" && [ "$(ls "$W"/a/ckpt_*.bin | wc -l)" -eq 1 ] \
   && [ -f "$W/a/ckpt_000003.bin" ] && [ "$(grep -c train_loss "$W/a/log.txt")" -eq 3 ]; then
    ok "-overwrite 1 replaces the old run: its checkpoints removed, a new 3-step log"
else bad "-overwrite 1: $(ls "$W/a") $(head -3 "$W/err.txt")"; fi

echo "== the final checkpoint comes before sampling =="
if run -n 2 -sample_every 2 -sample_len 16 -tok "$W/tok61.bin" -o "$W/s" >"$W/out.txt" 2>"$W/err.txt"; then
    saved=$(grep -n "^saved " "$W/out.txt" | head -1 | cut -d: -f1); sample=$(grep -n "^--- sample ---" "$W/out.txt" | head -1 | cut -d: -f1)
    [ -n "$saved" ] && [ -n "$sample" ] && [ "$saved" -lt "$sample" ] && ok "saved (line $saved) before the sample (line $sample)" \
        || bad "save line $saved, sample line $sample"
else bad "sampling run: $(head -3 "$W/err.txt")"; fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
