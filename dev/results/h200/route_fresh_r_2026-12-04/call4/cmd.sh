#!/usr/bin/env bash
# A/B: main (A) against D (the new slot read first, its r computed after the ring's next copy is issued), B2
cd "$(dirname "$0")/../.."
R=$OUT/r; mkdir -p $R
chmod +x runs/c3/*
mkdir -p data/bench
[ -f data/bench/random_3m.bin ] || python3 dev/make_shard.py data/bench/random_3m.bin --tokens 3000000 --vocab 50257 > /dev/null
ROUNDS=3 PROFILE_GREP='route \+|residual' bash dev/ab_gpu.sh runs/c3/train_mhar_cu_A runs/c3/train_mhar_cu_D "-r mhar -H 8" "-r mhar -H 8 -S 4" > $R/ab_D.txt 2>&1
grep -vE '^\s*$' $R/ab_D.txt | grep -E 'mode|^-r|profile|fwd route|residual|total'
ROUNDS=3 PROFILE_GREP='route \+|residual' bash dev/ab_gpu.sh runs/c3/train_mhar_cu_B2 runs/c3/train_mhar_cu_D "-r mhar -H 8" > $R/ab_B2D.txt 2>&1
grep -vE '^\s*$' $R/ab_B2D.txt | grep -E 'mode|^-r|profile|fwd route|residual|total'
tar -czf $OUT/r.tgz -C $OUT r
