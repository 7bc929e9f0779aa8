#!/usr/bin/env bash
# Per-op GPU time of a CUDA trainer run, from the trainer's NVTX ranges (one per op:
# kernels/common.cuh's op_range) under Nsight Systems: prints nsys's NVTX GPU projection
# summary (GPU time of the kernels launched inside each range, per range name).
#   usage: bash dev/nsys_ops.sh OUT BINARY [trainer flags ...]   (OUT: report path, no suffix)
# Without nsys (PATH, /usr/local/cuda/bin, /opt/nvidia/nsight-systems/*/bin) it prints one
# line saying so and exits 0: the breakdown is optional in the benchmarks.
set -uo pipefail
[ $# -ge 2 ] || { echo "usage: bash dev/nsys_ops.sh OUT BINARY [trainer flags ...]" >&2; exit 2; }
out=$1; shift
nsys=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
if [ -z "$nsys" ]; then
    echo "per-op profile skipped: nsys not found (NVTX ranges need Nsight Systems; see dev/cuda/README_cuda.md)"
    exit 0
fi
"$nsys" profile -t cuda,nvtx -o "$out" --force-overwrite true "$@" > "$out.log" 2>&1 \
    || { echo "nsys profile failed (log: $out.log):"; tail -5 "$out.log"; exit 1; }
"$nsys" stats -q -r nvtx_gpu_proj_sum -f column "$out.nsys-rep" 2>&1
