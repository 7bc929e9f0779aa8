#!/usr/bin/env bash
# ncu of the hc backward at the 100M shape: the lab's v12 and v16 (one launch each, after warm-ups)
cd "$(dirname "$0")"
chmod +x hc
R=$OUT/r; mkdir -p $R
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for v in 12 16; do
  $NCU --clock-control none -k regex:hc_norm_read_update_backward --launch-skip 3 --launch-count 1 \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats \
      --section WarpStateStats --section InstructionStats --section MemoryWorkloadAnalysis \
      ./hc --op bwd --version $v --bench --reps 3 > $R/ncu_bwd_v$v.txt 2>&1
done
tar czf $OUT/r.tgz -C $OUT r
for v in 12 16; do grep -E "Duration|DRAM Throughput|Memory Throughput|Executed Ipc A|Issue Slots Busy|No Eligible|Issued Warp Per|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Executed Instructions  |Avg. Active Threads" $R/ncu_bwd_v$v.txt | head -20; echo; done
