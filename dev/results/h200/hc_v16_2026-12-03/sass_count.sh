#!/usr/bin/env bash
# SASS instruction counts of the hc kernels at the 100m shape (bwd n=4 NPK=1 24-bit, fwd n=4 NPK=2)
bin=$1
CUOBJ=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
$CUOBJ -sass "$bin" | awk '
/Function : / { fn = $3; next }
/\/\*[0-9a-f]+\*\// && (fn ~ /hc_norm_read_update_backward_kernelILi4ELi1E.*HcGrad24E/ || fn ~ /hc_update_read_norm_kernelILi4ELi2E/) {
    line = $0; sub(/^[ \t]*\/\*[0-9a-f]+\*\/[ \t]*/, "", line); sub(/^@!?U?P[0-9T] +/, "", line)
    split(line, f, /[ .;]/); op = f[1]; if (op == "") next
    n[fn]++; c[fn, op]++
}
END {
    for (k in n) {
        printf "%s: %d instructions\n", k, n[k]
        for (kk in c) { split(kk, p, SUBSEP); if (p[1] == k && c[kk] >= 8) printf "   %-8s %d\n", p[2], c[kk] }
    }
}'
