#!/usr/bin/env bash
# test_mhar on the GPU with main at 5dbb90d (hc v17 and the encoder's counting sort; 54a5440 adds lab code only)
cd "$(dirname "$0")"
chmod +x train_mhar train_mhar_cu train_mhar_cu_fp32 test_mhar
R=$OUT/r; mkdir -p $R
cd ../..
cp runs/c5/train_mhar runs/c5/train_mhar_cu runs/c5/train_mhar_cu_fp32 runs/c5/test_mhar .
./test_mhar > $R/test_mhar.txt 2>&1; echo "rc $?" >> $R/test_mhar.txt
grep -E "FAIL|SKIP" $R/test_mhar.txt | head; tail -2 $R/test_mhar.txt
