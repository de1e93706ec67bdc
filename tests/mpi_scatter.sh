#!/bin/sh
# mpi_scatter.sh — the balancer's per-step scatter under MPI with 3 ranks (test_mpi_scatter prints the TAP).
MPIEXEC=${MPIEXEC:-mpirun}
exec $MPIEXEC -np 3 --oversubscribe ./tests/test_mpi_scatter
