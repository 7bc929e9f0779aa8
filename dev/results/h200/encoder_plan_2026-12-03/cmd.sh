#!/usr/bin/env bash
# the encoder backward's token plan sorted on the host during the head's backward and uploaded
# from pinned memory (no mid-backward drain), the targets uploaded at the forward's start:
# 6 steps of each mode against main (must be bit-identical), then a trainer A/B of std and hc
cd "$(dirname "$0")"
chmod +x tr_main tr_enc
R=$OUT/r; mkdir -p $R
cd ../..
mkdir -p data/bench
[ -f data/bench/random_3m.bin ] || python3 dev/make_shard.py data/bench/random_3m.bin --tokens 3000000 --vocab 50257
: > $R/steps_cmp.txt
for m in "-r std" "-r mhar -H 8" "-r hc -hc_n 4" "-r delta -H 8 -S 8"; do
  for b in tr_main tr_enc; do
    runs/c6/$b -preset 100m -T 2048 -b 16 -warmup 1 -i data/bench/random_3m.bin -j '' -sample_every 0 -val_every 0 \
        -n 6 $m 2>&1 | grep "^step" | cut -d'|' -f1-4 > $R/steps_$b.txt
  done
  if cmp -s $R/steps_tr_main.txt $R/steps_tr_enc.txt && [ -s $R/steps_tr_main.txt ]; then r=identical; else r=DIFFER; fi
  echo "$m: 6 steps $r ($(tail -1 $R/steps_tr_enc.txt))" >> $R/steps_cmp.txt
done
# gradient accumulation (2 micro-batches a step) and an evaluation pass
for b in tr_main tr_enc; do
  runs/c6/$b -preset 100m -T 2048 -b 8 -d 32768 -warmup 1 -i data/bench/random_3m.bin -j data/bench/random_3m.bin \
      -sample_every 0 -val_every 3 -val_batches 2 -n 6 -r mhar -H 8 2>&1 | grep -E "^step|val" | cut -d'|' -f1-4 > $R/acc_$b.txt
done
cmp -s $R/acc_tr_main.txt $R/acc_tr_enc.txt && [ -s $R/acc_tr_main.txt ] && echo "accumulation + val: identical" >> $R/steps_cmp.txt || echo "accumulation + val: DIFFER" >> $R/steps_cmp.txt
ROUNDS=2 PROFILE_GREP=encoder bash dev/ab_gpu.sh runs/c6/tr_main runs/c6/tr_enc "-r std" "-r hc -hc_n 4" > $R/ab.txt 2>&1
tar czf $OUT/r.tgz -C $OUT r
cat $R/steps_cmp.txt; head -3 $R/acc_tr_enc.txt; sed -n '3,6p' $R/ab.txt; grep -E "encoder|total|^profile" $R/ab.txt
