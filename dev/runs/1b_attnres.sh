#!/usr/bin/env bash
# The 1b scale, residual mode: -r attnres. T=1024 and 32 sequences per step (SPEC
# section 6 via the issue); 40,000 steps (1.3B tokens) and peak LR 2e-4 are our choice,
# since SPEC gives no step count or LR for this scale. Rerun to resume. See run.sh.
exec "$(dirname "$0")/run.sh" 1b_attnres 1b 32 40000 2e-4 -r attnres "$@"
