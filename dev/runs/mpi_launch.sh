#!/usr/bin/env bash
# Start N copies of a command, one process per GPU of this machine, under its mpirun
# (Open MPI or MPICH's Hydra), for data-parallel training (common/dist.h reads the rank
# each launcher sets). NVLink multicast stays off: NCCL_NVLS_ENABLE defaults to 0 and,
# like every MHAR_* variable, reaches every rank.
#   dev/runs/mpi_launch.sh N ./train_mhar_cu [flags]
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 N command [args]" >&2; exit 1; }
N=$1
shift
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
command -v mpirun >/dev/null || { echo "error: mpirun is not on PATH: install Open MPI, or start each rank with RANK, WORLD_SIZE and LOCAL_RANK set (common/dist.h)" >&2; exit 1; }
if [[ $(mpirun --version 2>&1) == *"Open MPI"* ]]; then
    ARGS=(-np "$N" --bind-to none -x NCCL_NVLS_ENABLE)
    for v in $(compgen -e); do [[ $v != MHAR_* ]] || ARGS+=(-x "$v"); done
    [ "$(id -u)" -ne 0 ] || ARGS+=(--allow-run-as-root)
else   # Hydra passes the whole environment on
    ARGS=(-np "$N")
fi
exec mpirun "${ARGS[@]}" "$@"
