#!/usr/bin/env bash
# ncu: the opcode mix of the trainer's lean gather (slot 12, 13 readers) and of the routing forward
cd "$(dirname "$0")/../.."
R=$OUT/r; mkdir -p $R
chmod +x runs/c3/*
mkdir -p data/bench
[ -f data/bench/random_3m.bin ] || python3 dev/make_shard.py data/bench/random_3m.bin --tokens 3000000 --vocab 50257 > /dev/null
T=(runs/c3/train_mhar_cu -preset 100m -T 2048 -b 16 -warmup 1 -i data/bench/random_3m.bin -j "" -sample_every 0 -val_every 0 -n 2 -r mhar -H 8)
timeout 150 ncu --metrics sass__inst_executed_per_opcode --print-metric-instances details --kernel-name regex:route_slot_backward_kernel \
  --launch-skip 37 --launch-count 1 "${T[@]}" > $R/ncu_gather_opcodes.txt 2>&1
grep -A40 "sass__inst_executed_per_opcode" $R/ncu_gather_opcodes.txt | head -42
timeout 150 ncu --metrics sass__inst_executed_per_opcode --print-metric-instances details \
  --kernel-name regex:route_forward --launch-skip 20 --launch-count 1 "${T[@]}" > $R/ncu_forward_opcodes.txt 2>&1
grep -A40 "sass__inst_executed_per_opcode" $R/ncu_forward_opcodes.txt | head -42
tar -czf $OUT/r.tgz -C $OUT r
