#!/usr/bin/env bash
# call 1: v12 (byte-permute packing) against v10: lab check/bench, SASS counts, trainer A/B, GPU test
cd "$(dirname "$0")"
for f in *.xz; do xz -d "$f"; done
chmod +x hc tr_v10 sass_count.sh
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $R/gpu.txt 2>&1
./hc --op bwd --version 12 --check > $R/check_v12.txt 2>&1; echo "rc $?" >> $R/check_v12.txt
./hc --op bwd --version 10 --check > $R/check_v10.txt 2>&1; echo "rc $?" >> $R/check_v10.txt
for i in 1 2; do ./hc --op bwd --version 10 --bench; ./hc --op bwd --version 12 --bench; done > $R/bench.txt 2>&1
./sass_count.sh hc > $R/sass.txt 2>&1
cd ../..
ROUNDS=2 PROFILE_GREP=hc bash dev/ab_gpu.sh runs/c1/tr_v10 ./train_mhar_cu "-r hc -hc_n 4" > $R/ab.txt 2>&1
tar czf $OUT/r.tgz -C $OUT r
tail -3 $R/check_v12.txt $R/check_v10.txt; grep "bwd v1" $R/bench.txt; head -40 $R/sass.txt; tail -25 $R/ab.txt
