#!/usr/bin/env bash
# qg in pair order for the gather (lab v23; trainer B): lab check (v16's bits) and bench against v21;
# trainer A/B, 2 rounds: main (A) against B
cd "$(dirname "$0")/../.."
R=$OUT/r; mkdir -p $R
chmod +x runs/c8/*
mkdir -p data/bench
[ -f data/bench/random_3m.bin ] || python3 dev/make_shard.py data/bench/random_3m.bin --tokens 3000000 --vocab 50257 > /dev/null
runs/c8/route --version 23 --check > $R/check_v23.txt 2>&1; echo "rc $?" >> $R/check_v23.txt
grep -E "FAIL|check:|against v16|rc " $R/check_v23.txt | head -20
runs/c8/route --version 21 --vmax 23 --bench 2>&1 | grep -E "^v[0-9]+ " > $R/bench_lab.txt
runs/c8/route --version 21 --vmax 23 --bench --S 4 2>&1 | grep -E "^v[0-9]+ " >> $R/bench_lab.txt
cut -c1-250 $R/bench_lab.txt
ROUNDS=2 PROFILE_GREP='route|residual' bash dev/ab_gpu.sh runs/c8/train_mhar_cu_A runs/c8/train_mhar_cu_B \
  "-r mhar -H 8" "-r mhar -H 8 -S 4" "-r mhar -H 8 -S 8" > $R/ab.txt 2>&1
grep -vE '^\s*$' $R/ab.txt | grep -E 'mode|^-r|profile|route|residual|total|B/A'
tar -czf $OUT/r.tgz -C $OUT r
