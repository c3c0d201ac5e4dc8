#!/bin/sh
# LOG_COMPILER for make check: a test whose name contains _npN runs as an MPI program on N
# ranks (oversubscribed, under a time limit); any other test runs as it is.
np=$(basename "$1" | sed -n 's/.*_np\([0-9][0-9]*\).*/\1/p')
if [ -n "$np" ]; then
  export OMP_NUM_THREADS=1 # the ranks share the machine's cores
  exec timeout 300 "${GJ_MPIRUN:-mpirun}" --oversubscribe -np "$np" "$@"
fi
exec "$@"
