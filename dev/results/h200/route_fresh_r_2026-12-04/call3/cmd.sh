#!/usr/bin/env bash
# A/B: main (A) against B2 (the routing forward computes r of the slots no chained add wrote, read last)
# and C (the same, the new slot read first)
cd "$(dirname "$0")/../.."
R=$OUT/r; mkdir -p $R
chmod +x runs/c2/*
mkdir -p data/bench
[ -f data/bench/random_3m.bin ] || python3 dev/make_shard.py data/bench/random_3m.bin --tokens 3000000 --vocab 50257 > /dev/null
for b in A C; do
  runs/c2/train_mhar_cu_$b -preset 100m -T 2048 -b 16 -warmup 1 -i data/bench/random_3m.bin -j '' -sample_every 0 -val_every 0 -n 6 -r mhar -H 8 \
    | grep ^step | cut -d'|' -f1-4 > $R/steps_$b.txt
done
paste $R/steps_A.txt $R/steps_C.txt | cut -c1-160
for b in B2 C; do
  ROUNDS=2 PROFILE_GREP='route|residual' bash dev/ab_gpu.sh runs/c2/train_mhar_cu_A runs/c2/train_mhar_cu_$b "-r mhar -H 8" "-r mhar -H 8 -S 4" "-r mhar -H 8 -S 8" > $R/ab_$b.txt 2>&1
  grep -vE '^\s*$' $R/ab_$b.txt | grep -E 'mode|^-r|profile|fwd route|residual|total'
done
tar -czf $OUT/r.tgz -C $OUT r
