#!/usr/bin/env bash
# test_mhar on the GPU with the new case "C=384 H=3" (the routing kernels' generic instances, lanes past C)
cd "$(dirname "$0")"
chmod +x train_mhar train_mhar_cu train_mhar_cu_fp32 test_mhar
R=$OUT/r; mkdir -p $R
cd ../..
cp runs/c6/train_mhar runs/c6/train_mhar_cu runs/c6/train_mhar_cu_fp32 runs/c6/test_mhar .
./test_mhar > $R/test_mhar.txt 2>&1; echo "rc $?" >> $R/test_mhar.txt
grep -E "FAIL|SKIP|C=384" $R/test_mhar.txt | head -20; tail -2 $R/test_mhar.txt
tar czf $OUT/r.tgz -C $OUT r
