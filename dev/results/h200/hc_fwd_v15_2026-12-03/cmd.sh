#!/usr/bin/env bash
# call 5: the hc forward at more warps an SM (lab v15: check, bench), trainer A/Bs of two builds
# against main (./train_mhar_cu), 6 training steps of each (the losses must be main's bits)
R=$OUT/r; mkdir -p $R
cd runs/c5 && chmod +x hc tr_8x3 tr_4x6
./hc --op fwd --version 15 --check > $R/check_v15.txt 2>&1; echo "rc $?" >> $R/check_v15.txt
./hc --op fwd --version 15 --bench > $R/bench_v15.txt 2>&1
cd ../..
tar czf $OUT/r.tgz -C $OUT r
ROUNDS=2 PROFILE_GREP=hc bash dev/ab_gpu.sh ./train_mhar_cu runs/c5/tr_8x3 "-r hc -hc_n 4" > $R/ab_8x3.txt 2>&1
tar czf $OUT/r.tgz -C $OUT r
ROUNDS=2 PROFILE_GREP=hc bash dev/ab_gpu.sh ./train_mhar_cu runs/c5/tr_4x6 "-r hc -hc_n 4" > $R/ab_4x6.txt 2>&1
for b in ./train_mhar_cu runs/c5/tr_8x3 runs/c5/tr_4x6; do
    $b -preset 100m -T 2048 -b 16 -warmup 1 -i data/bench/random_3m.bin -j '' -sample_every 0 -val_every 0 \
        -n 6 -r hc -hc_n 4 2>&1 | grep "^step" | cut -d'|' -f1-4 > $R/steps_$(basename $b).txt
done
tar czf $OUT/r.tgz -C $OUT r
grep -v "^device" $R/check_v15.txt | cut -c1-200; cat $R/bench_v15.txt | grep v15
for f in ab_8x3 ab_4x6; do sed -n '3,4p' $R/$f.txt; grep -E "fwd hc|total" $R/$f.txt; done
paste $R/steps_train_mhar_cu.txt $R/steps_tr_8x3.txt $R/steps_tr_4x6.txt | cut -c1-200
