#!/usr/bin/env bash
# Diagnosis: where the trainer's lean gather (FULL, slot 12 of mhar H=8) and routing forward stall; per-kernel
# times of lab v21 and v22's site and gather launches (one backward each)
cd "$(dirname "$0")/../.."
R=$OUT/r; mkdir -p $R
chmod +x runs/c7/* runs/c6/*
mkdir -p data/bench
[ -f data/bench/random_3m.bin ] || python3 dev/make_shard.py data/bench/random_3m.bin --tokens 3000000 --vocab 50257 > /dev/null
T=(runs/c7/train_mhar_cu -preset 100m -T 2048 -b 16 -warmup 1 -i data/bench/random_3m.bin -j "" -sample_every 0 -val_every 0 -n 2 -r mhar -H 8)
ST=""
for s in long_scoreboard short_scoreboard mio_throttle lg_throttle wait math_pipe_throttle not_selected selected \
         dispatch_stall no_instruction barrier branch_resolving drain membar tex_throttle imc_miss sleeping misc; do
  ST="$ST,smsp__average_warps_issue_stalled_${s}_per_issue_active.ratio"
done
M="gpu__time_duration.sum,smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active"
M="$M,l1tex__data_pipe_lsu_wavefronts.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum"
M="$M,l1tex__data_bank_conflicts_pipe_lsu.sum,l1tex__data_pipe_lsu_wavefronts.avg.pct_of_peak_sustained_elapsed"
M="$M,l1tex__lsuin_requests.avg.pct_of_peak_sustained_elapsed,l1tex__throughput.avg.pct_of_peak_sustained_elapsed"
M="$M,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,l1tex__m_xbar2l1tex_read_sectors.sum"
M="$M,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active$ST"
timeout 200 ncu --metrics "$M" --section MemoryWorkloadAnalysis --kernel-name regex:route_slot_backward_kernel \
  --launch-skip 37 --launch-count 1 "${T[@]}" > $R/ncu_gather_slot12.txt 2>&1
timeout 200 ncu --metrics "$M" --section MemoryWorkloadAnalysis --kernel-name regex:route_forward14_kernel \
  --launch-skip 37 --launch-count 1 "${T[@]}" > $R/ncu_forward_site12.txt 2>&1
for f in ncu_gather_slot12 ncu_forward_site12; do
  echo "== $f"; grep -E "route_|gpu__time|inst_executed|issue_active|wavefronts|bank_conf|lsuin|l1tex__thr|sectors|dram__|warps_active|stalled|Mem Busy|Max Bandwidth|Mem Pipes|L1/TEX Hit" $R/$f.txt \
    | sed -e 's/smsp__average_warps_issue_stalled_//' -e 's/_per_issue_active.ratio//' | cut -c1-150
done
for v in 21 22; do
  timeout 150 ncu --metrics gpu__time_duration.sum --kernel-name regex:"route_(gather|site)" --launch-count 50 \
    runs/c6/route --version $v --bench > $R/ncu_lab_v$v.txt 2>&1
  echo "== lab v$v"; python3 - $R/ncu_lab_v$v.txt <<'PY'
import re, sys
cur=None; tot={}
for line in open(sys.argv[1]):
    m=re.search(r'(route_\w+?_kernel)', line)
    if m and '(' in line: cur=m.group(1)
    m=re.search(r'gpu__time_duration.sum\s+(\S+)\s+([\d.,]+)', line)
    if m and cur:
        v=float(m.group(2).replace(',','')); u=m.group(1)
        v = v/1000 if u.startswith('n') else (v*1000 if u.startswith('m') else v)
        tot.setdefault(cur,[0,0]); tot[cur][0]+=v; tot[cur][1]+=1
for k,(s,n) in tot.items(): print(f"{k}: {n} launches, {s:.1f} us")
PY
done
tar -czf $OUT/r.tgz -C $OUT r
