#!/usr/bin/env bash
# main at 74fdec4 on the GPU (test_mhar; hc 6 steps against 144686f, before the review mend);
# two trainer knobs A/B: q/gamma partitions of 64 rows, a ring of 8 stages
cd "$(dirname "$0")/../.."
R=$OUT/r; mkdir -p $R
chmod +x runs/c2/*
cp runs/c2/train_mhar runs/c2/train_mhar_cu runs/c2/train_mhar_cu_fp32 runs/c2/test_mhar .
mkdir -p data/bench
[ -f data/bench/random_3m.bin ] || python3 dev/make_shard.py data/bench/random_3m.bin --tokens 3000000 --vocab 50257 > /dev/null
./test_mhar > $R/test_mhar.txt 2>&1; echo "rc $?" >> $R/test_mhar.txt
grep -E "FAIL|SKIP" $R/test_mhar.txt | head; tail -2 $R/test_mhar.txt
for b in premend train_mhar_cu; do
  p=runs/c2/$b; [ $b = train_mhar_cu ] && p=./train_mhar_cu
  $p -preset 100m -T 2048 -b 16 -warmup 1 -i data/bench/random_3m.bin -j '' -sample_every 0 -val_every 0 -n 6 -r hc \
    | grep ^step | cut -d'|' -f1-4 > $R/steps_hc_$b.txt
done
cmp $R/steps_hc_premend.txt $R/steps_hc_train_mhar_cu.txt && echo "hc 6 steps: bit-identical"; tail -1 $R/steps_hc_train_mhar_cu.txt
ROUNDS=2 PROFILE_GREP='route' bash dev/ab_gpu.sh ./train_mhar_cu runs/c2/rows64 "-r mhar -H 8" "-r mhar -H 8 -S 4" > $R/ab_rows64.txt 2>&1
grep -vE '^\s*$' $R/ab_rows64.txt | grep -E 'mode|^-r|q/gamma|gather|total' | head -20
ROUNDS=2 PROFILE_GREP='route' bash dev/ab_gpu.sh ./train_mhar_cu runs/c2/ring8 "-r mhar -H 8" "-r mhar -H 8 -S 4" > $R/ab_ring8.txt 2>&1
grep -vE '^\s*$' $R/ab_ring8.txt | grep -E 'mode|^-r|fwd route|gather|total' | head -20
tar -czf $OUT/r.tgz -C $OUT r
