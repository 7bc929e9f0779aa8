#!/usr/bin/env bash
# st_lane rounding bf16 in pairs (routing kernels' floatX stores): 6 steps of each mode against
# main (must be bit-identical), then a trainer A/B of mhar H=8 and block S=4
cd "$(dirname "$0")"
chmod +x tr_main tr_stl
R=$OUT/r; mkdir -p $R
cd ../..
mkdir -p data/bench
[ -f data/bench/random_3m.bin ] || python3 dev/make_shard.py data/bench/random_3m.bin --tokens 3000000 --vocab 50257
: > $R/steps_cmp.txt
for m in "-r std" "-r mhar -H 8" "-r mhar -H 8 -S 4" "-r delta -H 8 -S 8"; do
  for b in tr_main tr_stl; do
    runs/c4/$b -preset 100m -T 2048 -b 16 -warmup 1 -i data/bench/random_3m.bin -j '' -sample_every 0 -val_every 0 \
        -n 6 $m 2>&1 | grep "^step" | cut -d'|' -f1-4 > $R/steps_$b.txt
  done
  if cmp -s $R/steps_tr_main.txt $R/steps_tr_stl.txt && [ -s $R/steps_tr_main.txt ]; then r=identical; else r=DIFFER; fi
  echo "$m: 6 steps $r ($(tail -1 $R/steps_tr_stl.txt))" >> $R/steps_cmp.txt
done
ROUNDS=2 PROFILE_GREP=route bash dev/ab_gpu.sh runs/c4/tr_main runs/c4/tr_stl "-r mhar -H 8" "-r mhar -H 8 -S 4" > $R/ab.txt 2>&1
tar czf $OUT/r.tgz -C $OUT r
cat $R/steps_cmp.txt; sed -n '3,6p' $R/ab.txt; grep -E "route|total|^profile" $R/ab.txt
