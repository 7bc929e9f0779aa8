#!/usr/bin/env bash
# The paper's 100M run (SPEC section 6), residual mode: -r mhar -H 8 -S 4.
# 64 sequences of 2048 tokens per step, 20,000 steps (2.6B tokens), peak LR 5e-4.
# Rerun to resume. Environment: see run.sh (DATA, B, TRAINER, RUNS, SEED).
exec "$(dirname "$0")/run.sh" 100m_block_mhar8_S4 100m 64 20000 5e-4 -r mhar -H 8 -S 4 "$@"
