#!/usr/bin/env bash
# The 350m scale, residual mode: -r mhar -H 8. T=1024 and 32 sequences per step (SPEC
# section 6 via the issue); 40,000 steps (1.3B tokens) and peak LR 3e-4 are our choice,
# since SPEC gives no step count or LR for this scale. Rerun to resume. See run.sh.
# Data-parallel on the GPUs of one machine (mpirun, one process per GPU; B per GPU):
#   NGPU=2 dev/runs/350m_mhar8.sh          (32 sequences = 2 GPUs x 1 micro-batch of B=16)
#   NGPU=4 B=8 dev/runs/350m_mhar8.sh      (32 = 4 GPUs x 1 micro-batch of B=8; B*NGPU must divide 32)
exec "$(dirname "$0")/run.sh" 350m_mhar8 350m 32 40000 3e-4 -r mhar -H 8 "$@"
