#!/usr/bin/env bash
# A/B, 2 rounds, of the gather's qg in pair order at the layouts whose FULL instance has SEG 32 (one
# head a chunk or wider: H=1 and H=2 at C=512), where ptxas now spills 28 bytes: main (A) against B
cd "$(dirname "$0")/../.."
R=$OUT/r; mkdir -p $R
chmod +x runs/c10/*
mkdir -p data/bench
[ -f data/bench/random_3m.bin ] || python3 dev/make_shard.py data/bench/random_3m.bin --tokens 3000000 --vocab 50257 > /dev/null
ROUNDS=2 PROFILE_GREP='gather' bash dev/ab_gpu.sh runs/c10/train_mhar_cu_A runs/c10/train_mhar_cu_B \
  "-r mhar -H 1" "-r mhar -H 2" > $R/ab_seg32.txt 2>&1
grep -vE '^\s*$' $R/ab_seg32.txt | grep -E 'mode|^-r|profile|gather|total'
tar -czf $OUT/r.tgz -C $OUT r
