#!/usr/bin/env bash
# lab v20's check with the committed lab (relative differences from v16 printed); ncu instruction mix of
# the trainer's lean gather (slot 12, 13 readers) and routing forward, mhar H=8, 100M, step 2
cd "$(dirname "$0")/../.."
R=$OUT/r; mkdir -p $R
chmod +x runs/c3/*
mkdir -p data/bench
[ -f data/bench/random_3m.bin ] || python3 dev/make_shard.py data/bench/random_3m.bin --tokens 3000000 --vocab 50257 > /dev/null
runs/c3/route --version 20 --check > $R/check_v20.txt 2>&1; echo "rc $?" >> $R/check_v20.txt
grep -E "against v16|check:|rc " $R/check_v20.txt | head -10
T=(runs/c3/train_mhar_cu -preset 100m -T 2048 -b 16 -warmup 1 -i data/bench/random_3m.bin -j "" -sample_every 0 -val_every 0 -n 2 -r mhar -H 8)
timeout 200 ncu --section InstructionStats --section SpeedOfLight --section Occupancy --section WarpStateStats \
  --kernel-name regex:route_slot_backward_kernel --launch-skip 37 --launch-count 1 "${T[@]}" > $R/ncu_gather_slot12.txt 2>&1
grep -E "Executed Instructions|Issued Ipc|Duration|DRAM Throughput|Achieved Occupancy|Registers|Stall|Warp Cycles" $R/ncu_gather_slot12.txt | head -20
timeout 150 ncu --metrics sass__inst_executed_per_opcode --kernel-name regex:route_slot_backward_kernel --launch-skip 37 --launch-count 1 \
  "${T[@]}" > $R/ncu_gather_opcodes.txt 2>&1
grep -E "sass__inst_executed_per_opcode" -A60 $R/ncu_gather_opcodes.txt | head -70
tar -czf $OUT/r.tgz -C $OUT r
