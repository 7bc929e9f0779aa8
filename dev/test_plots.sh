#!/usr/bin/env bash
# Tests of the plotting scripts and the routing probe (issue 6, items 3 and 4):
#   1. dev/plot_loss.py on a tiny hand-written log of two runs: a real PNG comes out;
#      a log without data gives a one-line error and exit 1.
#   2. dev/route_probe end to end: train tiny mhar models (full and block mode) with
#      ./train_mhar on a random shard, probe their checkpoints, check the CSV against
#      SPEC sections 4-5 (rows per site, weights summing to 1, uniform weights for zero
#      queries, JS in [0, 1] and averaged <= per-position), draw it with plot_routing.py;
#      a std checkpoint and a non-checkpoint give one-line errors and a non-zero exit.
#   3. the width disagreement (route_probe -k, SPEC section 10): --self-test's hand-computed KLs,
#      then trained attnres and mhar H=4 checkpoints (the probe's alpha and slices against the
#      model's own weights), zero queries (KL 0), the seeded null, dev/plot_width.py.
#   4. dev/plot_hc.py on a tiny hc checkpoint (SPEC section 8): a PNG and its summary line;
#      an mhar checkpoint gives a one-line error.
# Prints one PASS/FAIL line per check and "N passed, N failed"; exits 1 on any failure.
#   bash dev/test_plots.sh        (needs ./train_mhar: make train_mhar)
set -u
cd "$(dirname "$0")/.."
PY=/usr/bin/python3
pass=0; fail=0
ok()  { echo "PASS $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1${2:+: $2}"; fail=$((fail + 1)); }
# check NAME CMD...: PASS when CMD exits 0
check() { local name=$1; shift; if "$@"; then ok "$name"; else bad "$name"; fi; }
finish() { echo "$pass passed, $fail failed"; [ "$fail" -eq 0 ]; exit $?; }

# --- dependencies: Debian's matplotlib and numpy (PyPI is not needed) ---
if ! $PY -c 'import matplotlib, numpy' 2>/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "test_plots: installing python3-matplotlib python3-numpy"
        apt-get update -qq >/dev/null && apt-get install -y -qq python3-matplotlib python3-numpy >/dev/null
    fi
    if ! $PY -c 'import matplotlib, numpy' 2>/dev/null; then
        bad "matplotlib" "missing; fix: sudo apt-get install -y python3-matplotlib python3-numpy"
        finish
    fi
fi
if [ ! -x ./train_mhar ]; then bad "train_mhar" "not built; fix: make train_mhar"; finish; fi
# the probe: rebuilt here when missing or older than its sources (same line as its Makefile target)
if [ ! -x dev/route_probe ] || [ dev/route_probe.c -nt dev/route_probe ] || [ train_mhar.c -nt dev/route_probe ]; then
    gcc -O3 -march=native -fopenmp -I. -o dev/route_probe dev/route_probe.c -lm || { bad "build dev/route_probe"; finish; }
fi

W=$(mktemp -d /tmp/test_plots.XXXXXX)
trap 'rm -rf "$W"' EXIT

# is_png FILE MINBYTES: the 8-byte PNG signature and at least MINBYTES bytes
is_png() {
    [ -f "$1" ] && [ "$(head -c 8 "$1" | od -An -tx1 | tr -d ' \n')" = "89504e470d0a1a0a" ] &&
        [ "$(stat -c %s "$1")" -ge "$2" ]
}
# one_line_error FILE PATTERN: stderr is exactly one line, starting "error:", containing PATTERN
one_line_error() {
    [ "$(wc -l < "$1")" -eq 1 ] && grep -q '^error: ' "$1" && grep -qF -- "$2" "$1"
}

# ---------------------------------------------------------------- plot_loss.py
mkdir -p "$W/std" "$W/mhar"
for run in std mhar; do
    off=$([ $run = std ] && echo 0.00 || echo 0.15)
    for s in 1 2 3 4 5 6 7 8 9 10; do
        loss=$(awk -v s=$s -v o=$off 'BEGIN { printf "%.9g", 4.5 - o + 2.0 / s }')
        echo "step $s train_loss $loss lr 1.0000e-03 grad_norm 0.5000 ms 10.0 tok_s 1000"
        if [ $((s % 5)) -eq 0 ]; then echo "step $s val_loss $(awk -v l=$loss 'BEGIN { printf "%.9g", l + 0.05 }')"; fi
    done > "$W/$run/log.txt"
done
$PY dev/plot_loss.py "$W/std/log.txt" "$W/mhar/log.txt" --ema 0.5 --title "test" --out "$W/loss.png" > "$W/pl.out" 2>&1
check "plot_loss.py draws two runs (exit 0)" [ $? -eq 0 ]
check "plot_loss.py output is a PNG of > 10 KB" is_png "$W/loss.png" 10000
$PY dev/plot_loss.py "$W/std" "$W/mhar" --labels std mhar --out "$W/loss2.png" > /dev/null 2>&1
check "plot_loss.py takes run directories and --labels" is_png "$W/loss2.png" 10000
printf 'hello\nstep x\n' > "$W/nodata.txt"
$PY dev/plot_loss.py "$W/nodata.txt" --out "$W/nodata.png" 2> "$W/err.txt" > /dev/null
rc=$?
check "plot_loss.py: a log with no data exits 1" [ $rc -eq 1 ]
check "plot_loss.py: ... with a one-line error naming the file" one_line_error "$W/err.txt" "$W/nodata.txt"
check "plot_loss.py: ... and writes no PNG" [ ! -e "$W/nodata.png" ]

# ---------------------------------------------------------------- route_probe
$PY dev/make_shard.py "$W/x.bin" --tokens 20000 --vocab 61 > /dev/null
# train_mhar ARGS...: the test preset (L=2 C=32 T=16) on the random shard, quiet
train() {
    OMP_NUM_THREADS=1 ./train_mhar -preset test -V 61 -i "$W/x.bin" -j "$W/x.bin" -b 4 \
        -val_every 0 -sample_every 0 "$@" > "$W/train.out" 2>&1
}
# check_csv CSV H S L: row count, sums and JS bounds against SPEC sections 4-5,
# computed here independently of the probe's own bookkeeping
check_csv() {
    $PY - "$@" <<'EOF'
import csv, sys
path, H, S, L = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rows = list(csv.DictReader(open(path)))
def nsrc(j):   # SPEC 5: b_0..b_m, plus the partial sum when p >= 1 (S = 1: j+1 sources)
    m, p = divmod(j, S)
    return m + 1 + (p >= 1)
want = sum(nsrc(j) for j in range(2 * L + 1)) * H
if len(rows) != want:
    sys.exit(f"{path}: {len(rows)} rows, want sum_j n_j * H = {want}")
groups = {}
for r in rows:
    groups.setdefault((int(r["site"]), int(r["head"])), []).append(float(r["weight"]))
    if not 0 <= float(r["weight"]) <= 1:
        sys.exit(f"weight {r['weight']} outside [0, 1]")
    if H > 1:
        ja, jp = float(r["js_avg_bits"]), float(r["js_pos_bits"])
        if not (0 <= ja <= 1 and 0 <= jp <= 1 and ja <= jp + 1e-9):   # JS is jointly convex
            sys.exit(f"site {r['site']}: JS averaged {ja}, per-position {jp}: want 0 <= avg <= pos <= 1")
if len(groups) != (2 * L + 1) * H:
    sys.exit(f"{len(groups)} (site, head) groups, want {(2 * L + 1) * H}")
for (j, h), w in groups.items():
    if len(w) != nsrc(j) or abs(sum(w) - 1) > 1e-5:
        sys.exit(f"site {j} head {h}: {len(w)} sources summing to {sum(w):.9f}, want {nsrc(j)} summing to 1")
EOF
}

# 1) full mhar H=2, trained 40 steps so that the queries moved off zero
train -r mhar -H 2 -n 40 -lr 1e-2 -o "$W/m"
check "train_mhar -r mhar -H 2 saves a checkpoint" [ -f "$W/m/ckpt_000040.bin" ]
./dev/route_probe -c "$W/m/ckpt_000040.bin" -j "$W/x.bin" -b 4 -n 3 -o "$W/m.csv" > "$W/probe.out" 2>&1
check "route_probe on the mhar H=2 checkpoint (exit 0)" [ $? -eq 0 ]
check "route_probe CSV: sum_j n_j*H rows, each (site, head) sums to 1 within 1e-5, JS bounds" check_csv "$W/m.csv" 2 1 2
check "route_probe CSV: full-mode source labels emb attn0 mlp0 attn1 mlp1" \
    [ "$(awk -F, 'NR > 1 && $1 == 4 && $2 == 0 { printf "%s ", $5 }' "$W/m.csv")" = "emb attn0 mlp0 attn1 mlp1 " ]
check "route_probe: trained queries route non-uniformly (some weight off 1/n_j by > 0.01)" \
    $PY -c "
import csv, sys
rows = list(csv.DictReader(open('$W/m.csv')))
n = {}
for r in rows: n[(r['site'], r['head'])] = n.get((r['site'], r['head']), 0) + 1
sys.exit(0 if any(abs(float(r['weight']) - 1 / n[(r['site'], r['head'])]) > 0.01 for r in rows) else 1)"
check "route_probe prints a per-site summary with JS" grep -q "JS averaged" "$W/probe.out"
./dev/route_probe -c "$W/m/ckpt_000040.bin" -j "$W/x.bin" -b 2 -n 2 -t 8 -o "$W/m8.csv" > /dev/null 2>&1
check "route_probe -t 8 (shorter than the checkpoint's T=16)" check_csv "$W/m8.csv" 2 1 2
./dev/route_probe -c "$W/m/ckpt_000040.bin" -j "$W/x.bin" -t 32 > /dev/null 2> "$W/err.txt"
check "route_probe -t over the checkpoint's T: one-line error" one_line_error "$W/err.txt" "-t 32"
$PY dev/plot_routing.py "$W/m.csv" --out "$W/route.png" > /dev/null 2>&1
check "plot_routing.py draws a PNG of > 10 KB" is_png "$W/route.png" 10000

# 2) zero queries (one step at lr 0 keeps the initialisation): every head is
#    uniform over its sources, 1/n_j (SPEC section 4), and the heads agree (JS 0)
train -r mhar -H 4 -n 1 -lr 0 -o "$W/z"
./dev/route_probe -c "$W/z/ckpt_000001.bin" -j "$W/x.bin" -b 2 -n 1 -o "$W/z.csv" > /dev/null 2>&1
check "route_probe: zero queries give weights 1/n_j and JS 0 (H=4)" $PY -c "
import csv, sys
rows = list(csv.DictReader(open('$W/z.csv')))
n = {}
for r in rows: n[(r['site'], r['head'])] = n.get((r['site'], r['head']), 0) + 1
bad = [r for r in rows if abs(float(r['weight']) - 1 / n[(r['site'], r['head'])]) > 1e-6
       or float(r['js_avg_bits']) > 1e-9 or float(r['js_pos_bits']) > 1e-9]
sys.exit(1 if bad or len(rows) != 15 * 4 else 0)"

# 3) block mode S=2: sources b_0, b_1, ... and the partial sum of the current block
train -r mhar -H 2 -S 2 -n 20 -lr 1e-2 -o "$W/b"
./dev/route_probe -c "$W/b/ckpt_000020.bin" -j "$W/x.bin" -b 4 -n 2 -o "$W/b.csv" > /dev/null 2>&1
check "route_probe block mode S=2: rows, sums and JS" check_csv "$W/b.csv" 2 2 2
check "route_probe block mode S=2: site 3 reads emb b1 partial" \
    [ "$(awk -F, 'NR > 1 && $1 == 3 && $2 == 1 { printf "%s ", $5 }' "$W/b.csv")" = "emb b1 partial " ]
$PY dev/plot_routing.py "$W/b.csv" --out "$W/route_b.png" > /dev/null 2>&1
check "plot_routing.py draws block mode" is_png "$W/route_b.png" 10000

# 5) the width disagreement (SPEC section 10, route_probe -k): hand-computed cases, then checkpoints
./dev/route_probe --self-test > "$W/self.out" 2>&1
check "route_probe --self-test: the KL measure on hand-computed cases ($(tail -1 "$W/self.out"))" \
    eval '[ $? -eq 0 ] && grep -q "^7 passed, 0 failed$" "$W/self.out"'
train -r attnres -n 40 -lr 1e-2 -o "$W/a"
./dev/route_probe -c "$W/a/ckpt_000040.bin" -j "$W/x.bin" -b 4 -n 2 -k "$W/a_w.csv" > "$W/a.out" 2>&1
check "route_probe -k on an attnres checkpoint (exit 0)" [ $? -eq 0 ]
# check_width CSV: 2L+1 = 5 sites, finite KL >= 0, a one-source site has KL 0 (trained and null)
check_width() {
    $PY - "$1" <<'EOF2'
import csv, math, sys
rows = list(csv.DictReader(open(sys.argv[1])))
if [r["site"] for r in rows] != ["0", "1", "2", "3", "4"]:
    sys.exit(f"sites {[r['site'] for r in rows]}, want 0..4")
for r in rows:
    kl, nl = float(r["kl_nats"]), float(r["kl_null_nats"])
    if not (math.isfinite(kl) and math.isfinite(nl) and kl >= 0 and nl >= 0):
        sys.exit(f"site {r['site']}: KL {kl}, null {nl}: want finite and >= 0")
    if int(r["n_sources"]) == 1 and (kl != 0 or nl != 0):
        sys.exit(f"site {r['site']} has one source but KL {kl}, null {nl}")
EOF2
}
check "route_probe -k CSV: one row per site, KL finite and >= 0, 0 at the one-source site" check_width "$W/a_w.csv"
check "route_probe -k: the trained attnres queries disagree across width (some site KL > 1e-3)" \
    awk -F, 'NR > 1 && $5 > 1e-3 {f = 1} END {exit !f}' "$W/a_w.csv"
check "route_probe -k: its alpha equals the model's routing weights (H=1, max gap < 1e-5)" \
    awk '/max \|difference\|/ {f = 1; if ($NF + 0 > 1e-5) exit 1} END {exit !f}' "$W/a.out"
./dev/route_probe -c "$W/a/ckpt_000040.bin" -j "$W/x.bin" -b 4 -n 2 -k "$W/a_w2.csv" > /dev/null 2>&1
./dev/route_probe -c "$W/a/ckpt_000040.bin" -j "$W/x.bin" -b 4 -n 2 -seed 2 -k "$W/a_w3.csv" > /dev/null 2>&1
check "route_probe -k: the null is seeded (same -seed: same CSV; -seed 2: another null, same trained KL)" \
    eval 'cmp -s "$W/a_w.csv" "$W/a_w2.csv" && ! cmp -s "$W/a_w.csv" "$W/a_w3.csv" &&
          [ "$(cut -d, -f5 "$W/a_w.csv")" = "$(cut -d, -f5 "$W/a_w3.csv")" ]'
# zero queries (the initialisation): every a_s and alpha uniform, and the null query has norm 0 too
./dev/route_probe -c "$W/z/ckpt_000001.bin" -j "$W/x.bin" -b 2 -n 1 -k "$W/z_w.csv" > /dev/null 2>&1
check "route_probe -k: zero queries give KL 0, trained and null, at every site" \
    awk -F, 'NR > 1 {n++; if ($5 != 0 || $6 != 0) exit 1} END {exit n != 5}' "$W/z_w.csv"
# mhar H=4 with 4 slices: the slice distributions are the model's own heads
train -r mhar -H 4 -n 30 -lr 1e-2 -o "$W/m4"
./dev/route_probe -c "$W/m4/ckpt_000030.bin" -j "$W/x.bin" -b 4 -n 2 -k "$W/m4_w.csv" > "$W/m4.out" 2>&1
check "route_probe -k on mhar H=4: the 4 slices' a_s equal the model's heads (max gap < 1e-5)" \
    eval 'check_width "$W/m4_w.csv" && grep -q "slice distributions a_s" "$W/m4.out" &&
          awk "/max \\|difference\\|/ {f = 1; if (\$NF + 0 > 1e-5) exit 1} END {exit !f}" "$W/m4.out"'
./dev/route_probe -c "$W/a/ckpt_000040.bin" -j "$W/x.bin" -slices 3 -k "$W/bad.csv" > /dev/null 2> "$W/err.txt"
rc=$?
check "route_probe -slices 3 (C=32): non-zero exit, one-line error, no CSV" \
    eval '[ $rc -ne 0 ] && one_line_error "$W/err.txt" "-slices 3" && [ ! -e "$W/bad.csv" ]'
$PY dev/plot_width.py "$W/a_w.csv" "$W/m4_w.csv" --labels attnres "mhar H=4" --out "$W/width.png" > /dev/null 2>&1
check "plot_width.py draws two checkpoints: a PNG of > 10 KB" is_png "$W/width.png" 10000
$PY dev/plot_width.py "$W/m.csv" --out "$W/w_bad.png" > /dev/null 2> "$W/err.txt"
rc=$?
check "plot_width.py on a route_probe -o CSV (not -k): exit 1, one-line error" \
    eval '[ $rc -eq 1 ] && one_line_error "$W/err.txt" "$W/m.csv" && [ ! -e "$W/w_bad.png" ]'

# 4) bad inputs: one-line errors, non-zero exit
train -r std -n 1 -o "$W/s"
./dev/route_probe -c "$W/s/ckpt_000001.bin" -j "$W/x.bin" -o "$W/s.csv" > /dev/null 2> "$W/err.txt"
rc=$?
check "route_probe on a std checkpoint exits non-zero" [ $rc -ne 0 ]
check "route_probe on a std checkpoint: one line 'has no routing: std mode'" one_line_error "$W/err.txt" "has no routing: std mode"
check "route_probe on a std checkpoint writes no CSV" [ ! -e "$W/s.csv" ]
./dev/route_probe -c "$W/std/log.txt" -j "$W/x.bin" > /dev/null 2> "$W/err.txt"
rc=$?
check "route_probe on a non-checkpoint: non-zero exit, one-line error naming the file" \
    eval '[ $rc -ne 0 ] && one_line_error "$W/err.txt" "$W/std/log.txt"'
head -c 5000 "$W/m/ckpt_000040.bin" > "$W/trunc.bin"
./dev/route_probe -c "$W/trunc.bin" -j "$W/x.bin" > /dev/null 2> "$W/err.txt"
rc=$?
check "route_probe on a truncated checkpoint: non-zero exit, one-line error" \
    eval '[ $rc -ne 0 ] && one_line_error "$W/err.txt" "truncated"'
$PY dev/plot_routing.py "$W/std/log.txt" --out "$W/x.png" > /dev/null 2> "$W/err.txt"
rc=$?
check "plot_routing.py on a non-probe file: exit 1, one-line error" \
    eval '[ $rc -eq 1 ] && one_line_error "$W/err.txt" "$W/std/log.txt"'

# ---------------------------------------------------------------- plot_hc.py (SPEC section 8)
train -r hc -hc_n 4 -n 20 -lr 1e-2 -o "$W/hc"
check "train_mhar -r hc -hc_n 4 saves a checkpoint" [ -f "$W/hc/ckpt_000020.bin" ]
$PY dev/plot_hc.py "$W/hc/ckpt_000020.bin" --out "$W/hc.png" > "$W/hc.out" 2>&1
check "plot_hc.py draws the hc checkpoint's w, A, beta as a PNG of > 10 KB" is_png "$W/hc.png" 10000
check "plot_hc.py: read weights within [0, 1], 4 sublayers, n=4" \
    $PY -c "
import re, sys
s = open('$W/hc.out').read()
m = re.search(r'(\d+) sublayers, n=(\d+); read weights ([-\d.]+) \.\. ([-\d.]+)', s)
sys.exit(0 if m and m.group(1) == '4' and m.group(2) == '4' and 0 <= float(m.group(3)) <= float(m.group(4)) <= 1 else 1)"
$PY dev/plot_hc.py "$W/m/ckpt_000040.bin" --out "$W/hc_m.png" > /dev/null 2> "$W/err.txt"
rc=$?
check "plot_hc.py on an mhar checkpoint: exit 1, one-line error, no PNG" \
    eval '[ $rc -eq 1 ] && one_line_error "$W/err.txt" "no hyper-connections: mhar mode" && [ ! -e "$W/hc_m.png" ]'

finish
