#!/usr/bin/env bash
# Tests of the study's scripts:
#   1. dev/runs/study_collect.py on the fixture dev/runs/fixtures/study/ (fake logs with known
#      val losses): the tail means, the std over seeds, the paired differences against std (paired
#      by seed, not by position), missing runs shown as such, the figure; a NaN val loss and an
#      unfinished log are one-line errors with exit 1.
#   2. dev/runs/study.sh end to end with the CPU trainer on a tiny matrix: one chunk of one run,
#      its logs packed into $OUT; a second call on a bare machine (empty runs folder) that skips
#      the run committed under the results folder, runs the next, probes it, and reports a run the
#      trainer refuses as FAILED without stopping; --status counts what is done.
#   3. dev/runs/cpu_ordering.sh end to end on random tokens: its table, and a rerun that keeps the runs.
# Prints one PASS/FAIL line per check and "N passed, N failed"; exits 1 on any failure.
#   bash dev/test_study.sh      (needs ./train_mhar: make train_mhar)
set -u
cd "$(dirname "$0")/.."
PY=/usr/bin/python3
pass=0; fail=0
ok()  { echo "PASS $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1${2:+: $2}"; fail=$((fail + 1)); }
check() { local name=$1; shift; if "$@"; then ok "$name"; else bad "$name"; fi; }
finish() { echo "$pass passed, $fail failed"; [ "$fail" -eq 0 ]; exit $?; }
one_line_error() { [ "$(wc -l < "$1")" -eq 1 ] && grep -q '^error: ' "$1" && grep -qF -- "$2" "$1"; }
# row METHOD: the collector's table row of METHOD
row() { grep "^| $1 |" "$W/t.md"; }
# has METHOD TEXT: METHOD's row holds the cell TEXT
has() { row "$1" | grep -qF "| $2 |"; }

if ! $PY -c 'import matplotlib, numpy' 2>/dev/null; then bad "matplotlib" "missing; fix: apt-get install -y python3-matplotlib python3-numpy"; finish; fi
W=$(mktemp -d /tmp/test_study.XXXXXX)
trap 'rm -rf "$W"' EXIT
F=dev/runs/fixtures/study

# ---------------------------------------------------------------- the collector
$PY dev/runs/study_collect.py --results $F/results --matrix $F/matrix.txt --table "$W/t.md" --fig "$W/v.png" > "$W/c.out" 2>&1
check "study_collect.py on the fixture (exit 0)" [ $? -eq 0 ]
# std: tails 2.95 (s1), 3.05 (s2): mean 3.0, sample std 0.0707
check "std: tail mean 3.0000 +- 0.0707 over 2 of 3 seeds, s3 missing" \
    eval 'has std "3.0000 +- 0.0707" && has std "2 of 3 (missing: s3)"'
# mhar8: tails 2.90, 2.96; paired differences -0.05, -0.09: mean -0.07, std 0.0283
check "mhar8: tail 2.9300 +- 0.0424, paired delta -0.0700 +- 0.0283 over 2 pairs" \
    eval 'has mhar8 "2.9300 +- 0.0424" && has mhar8 "-0.0700 +- 0.0283" && has mhar8 2'
# mhar4 has seed 2 only: 3.00 - std_s2 3.05 = -0.05 (paired by position it would be +0.05)
check "mhar4 (seed 2 only) pairs with std seed 2: delta -0.0500" has mhar4 "-0.0500"
check "attnres: one seed, delta -0.2000, no std shown" eval 'has attnres "-0.2000" && has attnres "2.7500" && has attnres "1 of 2 (missing: s2)"'
check "mhar16 (seed 3, std s3 missing): 'no paired seed'" has mhar16 "no paired seed"
check "hc4 without a log: 'not run'" eval 'has hc4 "not run" && has hc4 "0 of 1 (missing: s1)"'
check "tokens per run: 8 steps x 100 = 800" has std 800
check "the paper's numbers beside ours (mhar8: -0.061)" eval 'row mhar8 | grep -qF -- "-0.061"'
check "per-run table: std_s3 not run, mhar8_s2 tail 2.9600" \
    eval 'grep -qF "| std_s3 | not run |" "$W/t.md" && grep -qF "| mhar8_s2 | 2.9600 |" "$W/t.md"'
check "figure: a PNG of > 20 KB" eval '[ "$(head -c 8 "$W/v.png" | od -An -tx1 | tr -d " \n")" = 89504e470d0a1a0a ] && [ $(stat -c %s "$W/v.png") -gt 20000 ]'
$PY dev/runs/study_collect.py --results $F/results_nan --matrix $F/matrix.txt --table "$W/n.md" --fig none > /dev/null 2> "$W/err.txt"
rc=$?
check "a NaN val loss: exit 1" [ $rc -eq 1 ]
check "... one-line error naming the log and 'not finite'" eval 'one_line_error "$W/err.txt" "results_nan/mhar8_s1/log.txt" && grep -q "not finite" "$W/err.txt"'
check "... and no table written" [ ! -e "$W/n.md" ]
cp -r $F/results "$W/short"
sed -i '/^step 8 /d' "$W/short/std_s1/log.txt"
$PY dev/runs/study_collect.py --results "$W/short" --matrix $F/matrix.txt --table "$W/s.md" --fig none > /dev/null 2> "$W/err.txt"
rc=$?
check "an unfinished log (last step 7 of 8): exit 1, one-line error" eval '[ $rc -eq 1 ] && one_line_error "$W/err.txt" "ends at step 7"'

# ---------------------------------------------------------------- study.sh, end to end on the CPU
if [ ! -x ./train_mhar ]; then bad "train_mhar" "not built; fix: make train_mhar"; finish; fi
mkdir -p "$W/data" "$W/res" "$W/out1" "$W/out2"
$PY dev/make_shard.py "$W/x.bin" --tokens 20000 --vocab 61 > /dev/null
$PY -c "import lzma, sys; d = open(sys.argv[1], 'rb').read()
for n in ('study_train_000000.bin.xz', 'study_val_000000.bin.xz'): open(sys.argv[2] + '/' + n, 'wb').write(lzma.compress(d))" "$W/x.bin" "$W/data"
cat > "$W/matrix.txt" <<'EOF'
common -preset test -V 61 -b 4 -n 6 -val_every 2 -val_batches 2 -sample_every 0
std_s1      1  1.00  -r std
mhar5_s1    1  0.90  -r mhar -H 5
attnres_s1  1  0.90  -r attnres
EOF
export MATRIX="$W/matrix.txt" RESULTS="$W/res" DATA="$W/data" TRAINER=./train_mhar PROBE_FLAGS="-b 2 -n 1 -t 16" OMP_NUM_THREADS=1
RUNS="$W/runs1" OUT="$W/out1" bash dev/runs/study.sh --next 1 > "$W/s1.out" 2>&1
check "study.sh --next 1 (exit 0)" [ $? -eq 0 ]
tar -tzf "$W/out1/study_results.tar.gz" > "$W/list1" 2>/dev/null
check "chunk 1 ran std_s1 only and packed its log into \$OUT" eval '[ "$(cat "$W/list1" | tr "\n" " ")" = "std_s1/log.txt std_s1/train.txt " ]'
check "chunk 1 log: the last step's val loss (step 6)" eval 'tar -xzOf "$W/out1/study_results.tar.gz" std_s1/log.txt | grep -q "^step 6 val_loss "'
check "chunk 1 wrote \$OUT/chunk.txt" grep -q "done std_s1" "$W/out1/chunk.txt"
tar -xzf "$W/out1/study_results.tar.gz" -C "$W/res"   # what the lead commits under dev/results/study
RUNS="$W/runs2" OUT="$W/out2" bash dev/runs/study.sh > "$W/s2.out" 2>&1   # a bare machine: runs2 is new
check "study.sh, second call on a bare machine (exit 0)" [ $? -eq 0 ]
check "second call skips std_s1 (done in the results folder)" eval '! grep -q "done std_s1" "$W/out2/chunk.txt" && [ ! -d "$W/runs2/std_s1" ]'
check "a run the trainer refuses (-H 5 does not divide C = 32) is reported FAILED, and the chunk goes on" \
    eval 'grep -q "FAILED mhar5_s1" "$W/out2/chunk.txt" && grep -q "done attnres_s1" "$W/out2/chunk.txt"'
tar -tzf "$W/out2/study_results.tar.gz" > "$W/list2" 2>/dev/null
check "second chunk packs attnres_s1 with its probe (probe.csv, probe_width.csv), not mhar5_s1" \
    eval 'grep -qx attnres_s1/probe_width.csv "$W/list2" && grep -qx attnres_s1/probe.csv "$W/list2" && ! grep -q mhar5 "$W/list2"'
check "the probe's alpha matches the model's weights (< 1e-5)" \
    eval 'tar -xzOf "$W/out2/study_results.tar.gz" attnres_s1/probe.txt | awk "/max \\|difference\\|/ {f = 1; if (\$NF + 0 > 1e-5) exit 1} END {exit !f}"'
tar -xzf "$W/out2/study_results.tar.gz" -C "$W/res"
rm "$W/runs2/attnres_s1/probe_width.csv"
RUNS="$W/runs2" OUT="$W/out3" PROBE_FLAGS="-b 2 -n 1 -t 8" bash dev/runs/study.sh --probe > "$W/s3.out" 2>&1
check "--probe on a warm machine: probes the finished attnres run again (not std), packs it" \
    eval '[ -f "$W/runs2/attnres_s1/probe_width.csv" ] && grep -q "probing attnres_s1" "$W/out3/chunk.txt" &&
          ! grep -q "probing std" "$W/out3/chunk.txt" && tar -tzf "$W/out3/study_results.tar.gz" | grep -qx attnres_s1/probe_width.csv'
RUNS="$W/runs3" bash dev/runs/study.sh --status > "$W/st.out" 2>&1
check "--status: 2 of 3 runs done, 1 pending" grep -q "2 of 3 runs done; 1 pending" "$W/st.out"
bash dev/runs/study.sh --next x > /dev/null 2> "$W/err.txt"
rc=$?
check "study.sh --next x: non-zero exit, one-line error" eval '[ $rc -ne 0 ] && [ "$(wc -l < "$W/err.txt")" -eq 1 ] && grep -q -- "--next" "$W/err.txt"'
$PY dev/runs/study_collect.py --results "$W/res" --matrix "$W/matrix.txt" --table "$W/e.md" --fig "$W/e.png" > /dev/null 2>&1
check "the collector reads study.sh's own output (attnres delta against std, probe table)" \
    eval 'grep -q "^| attnres |.*| 1 |" "$W/e.md" && grep -q "KL trained" "$W/e.md" && [ -s "$W/width.png" ]'

# ---------------------------------------------------------------- dev/runs/cpu_ordering.sh
# two seeds of its four methods, 2 steps each, on random GPT-2 tokens: a table of four rows with a
# tail per seed, std's difference 0; a second call finds every run done and runs none
mkdir -p "$W/tiny"
$PY dev/make_shard.py "$W/tiny/r_train_000000.bin" --tokens 20000 --seed 1 > /dev/null
$PY dev/make_shard.py "$W/tiny/r_val_000000.bin" --tokens 20000 --seed 2 > /dev/null
DATA="$W/tiny" STEPS=2 SEEDS="1 2" bash dev/runs/cpu_ordering.sh "$W/ord" > "$W/ord1.out" 2>&1
rc=$?
check "cpu_ordering.sh: 8 runs, a table of std, attnres, mhar8, mhar8lr8 with two seeds, std's difference 0" \
    eval '[ $rc -eq 0 ] && [ "$(grep -c "^cpu_ordering: " "$W/ord1.out")" -eq 8 ] &&
          awk "/^(std|attnres|mhar8|mhar8lr8) / && NF == 5 && \$2 > 0 && \$3 > 0 {n++} /^std / && \$5 != \"0.0000\" {n = -99}
               END {exit n == 4 ? 0 : 1}" "$W/ord1.out"'
DATA="$W/tiny" STEPS=2 SEEDS="1 2" bash dev/runs/cpu_ordering.sh "$W/ord" > "$W/ord2.out" 2>&1
check "cpu_ordering.sh again: every run kept, none rerun, the same table" \
    eval '! grep -q "^cpu_ordering: " "$W/ord2.out" && diff <(grep "^std \|^attnres " "$W/ord1.out") <(grep "^std \|^attnres " "$W/ord2.out") > /dev/null'
finish
