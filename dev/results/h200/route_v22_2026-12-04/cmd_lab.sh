#!/usr/bin/env bash
# lab v22 (gather in the head-lane layout): check at the 8 configs, bench alternating with v21
cd "$(dirname "$0")/../.."
R=$OUT/r; mkdir -p $R
chmod +x runs/c6/*
runs/c6/route --version 22 --check > $R/check_v22.txt 2>&1; echo "rc $?" >> $R/check_v22.txt
grep -E "FAIL|PASS|v22 r of|against v16|rc " $R/check_v22.txt | head -40
for v in 21 22 21 22; do runs/c6/route --version $v --bench 2>&1 | grep -E "^v[0-9]+ "; done > $R/bench_lab.txt
for v in 21 22; do runs/c6/route --version $v --bench --S 4 2>&1 | grep -E "^v[0-9]+ "; done >> $R/bench_lab.txt
cut -c1-250 $R/bench_lab.txt
