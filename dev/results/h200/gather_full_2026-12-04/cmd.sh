#!/usr/bin/env bash
# the lean gather's FULL instance (C a compile-time constant where every lane is live): 6 steps against main, A/B
cd "$(dirname "$0")/../.."
R=$OUT/r; mkdir -p $R
chmod +x runs/c4/*
mkdir -p data/bench
[ -f data/bench/random_3m.bin ] || python3 dev/make_shard.py data/bench/random_3m.bin --tokens 3000000 --vocab 50257 > /dev/null
for b in base full; do
  for md in "-r mhar -H 8" "-r mhar -H 8 -S 4" "-r delta -H 8 -S 2"; do
    runs/c4/$b -preset 100m -T 2048 -b 16 -warmup 1 -i data/bench/random_3m.bin -j '' -sample_every 0 -val_every 0 -n 6 $md \
      | grep ^step | cut -d'|' -f1-4 >> $R/steps_$b.txt
  done
done
cmp $R/steps_base.txt $R/steps_full.txt && echo "18 steps (mhar, block S=4, delta): bit-identical"; tail -1 $R/steps_full.txt
ROUNDS=2 PROFILE_GREP='route' bash dev/ab_gpu.sh runs/c4/base runs/c4/full "-r mhar -H 8" "-r mhar -H 8 -S 4" "-r mhar -H 8 -S 8" > $R/ab.txt 2>&1
grep -vE '^\s*$' $R/ab.txt | grep -E 'mode|^-r|gather|total' | head -24
tar -czf $OUT/r.tgz -C $OUT r
