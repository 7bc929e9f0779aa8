#!/usr/bin/env bash
# SASS of the trainer's routing kernels (the lean gather, the grouped forward), for reading here
cd "$(dirname "$0")/../.."
R=$OUT/r; mkdir -p $R
which cuobjdump nvdisasm
cuobjdump -sass runs/c3/train_mhar_cu > $R/all.sass 2>&1; echo "rc $?"
grep -n "Function :" $R/all.sass | grep -E "route_slot_backward_kernel|route_forward14" | head
python3 - "$R/all.sass" "$R" <<'PY'
import sys, re
s = open(sys.argv[1]).read()
parts = re.split(r'(?=\n\s*Function : )', s)
for p in parts:
    m = re.search(r'Function : (\S+)', p)
    if not m: continue
    name = m.group(1)
    for key, out in (('route_slot_backward_kernelILi8ELi2ELi8ELb1', 'gather_lean.sass'), ('route_forward14_kernelILi2ELi8ELi0ELi1', 'fwd14_kx1.sass'), ('route_forward14_kernelILi2ELi8ELi0ELi0', 'fwd14_kx0.sass')):
        if key in name:
            open(sys.argv[2] + '/' + out, 'w').write(p)
PY
rm -f $R/all.sass
ls -la $R; wc -l $R/*.sass
tar -czf $OUT/r.tgz -C $OUT r
