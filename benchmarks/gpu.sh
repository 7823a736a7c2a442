#!/usr/bin/env bash
# The one command for a GPU machine: checks odesolve on the GPU against the CPU backend,
# then benchmarks it against Diffrax at GPU sizes, in at most 8 minutes of wall time.
#
#   benchmarks/gpu.sh FOLDER            # from the repository root; results into FOLDER
#   benchmarks/gpu.sh FOLDER --dry-run  # the CPU, tiny sizes: checks that it runs
#   benchmarks/gpu.sh FOLDER --rehearse # the CPU, tiny sizes, every stage and peer
#
# Needs JAX with CUDA, equinox, diffrax, optax, optimistix and lineax installed; odesolve
# runs from this source tree, nothing is downloaded. Writes FOLDER/results.json,
# log.txt, ratios.png and scaling.png. Exit status: 0, or 1 when the GPU and the CPU
# disagree (the run still measures everything), 2 when the time ran out (the JSON then
# holds what was measured), 137 when the outer 8-minute limit had to kill Python.
set -u
if [ $# -lt 1 ]; then
    echo "usage: benchmarks/gpu.sh FOLDER [--dry-run]" >&2
    exit 64
fi
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# Memory on demand, not 75% of the GPU at start: the peak in results.json is then what
# the runs used.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
PYTHON="${PYTHON:-$(command -v python || command -v python3)}"
# The Python side keeps its own budget (7.5 minutes) and watchdog; this is the last resort.
if command -v timeout > /dev/null; then
    exec timeout --signal=KILL 480 "$PYTHON" -u -m odesolve.bench._gpu "$@"
fi
exec "$PYTHON" -u -m odesolve.bench._gpu "$@"
