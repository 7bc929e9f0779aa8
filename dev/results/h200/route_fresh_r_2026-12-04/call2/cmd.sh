#!/usr/bin/env bash
# A/B: main (A) against the routing forward computing the new slot's r (B)
cd "$(dirname "$0")/../.."
R=$OUT/r; mkdir -p $R
chmod +x runs/c1/*
mkdir -p data/bench
[ -f data/bench/random_3m.bin ] || python3 dev/make_shard.py data/bench/random_3m.bin --tokens 3000000 --vocab 50257 > /dev/null
ROUNDS=2 PROFILE_GREP='route|residual' bash dev/ab_gpu.sh runs/c1/train_mhar_cu_A runs/c1/train_mhar_cu_B "-r mhar -H 8" "-r mhar -H 8 -S 4" "-r mhar -H 8 -S 8" > $R/ab.txt 2>&1
cat $R/ab.txt | grep -vE '^\s*$' | head -70
tar -czf $OUT/r.tgz -C $OUT r
