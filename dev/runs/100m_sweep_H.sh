#!/usr/bin/env bash
# The paper's H sweep at 100M: mhar with H = 1 (AttnRes), 4, 8, 16, one run after another,
# same data and seed. Rerun to resume where it stopped. Environment: see run.sh.
set -e
for H in 1 4 8 16; do
    "$(dirname "$0")/run.sh" 100m_sweep_H$H 100m 64 20000 5e-4 -r mhar -H $H "$@"
done
