#!/usr/bin/env bash
# The 2026-11-30 lease (one device-tool command, timeout 590 s): the steps in the order of what
# issue 42 needs first, each under its own limit, the run's directory packed after every step.
set -uo pipefail
out=${OUT:?}
D=benchmarks/gpu_runs/2026-11-30-h200/run2
mkdir -p "$D"
log="$out/gpu_run.log"
pack() { tar czf "$out/gpu_run.tar.gz" --exclude='*.ckpt*' "$D" 2>/dev/null; cp "$log" "$D/lease.log" 2>/dev/null; true; }
t0=$(date +%s)
stamp() { echo "[lease +$(( $(date +%s) - t0 )) s] $*" | tee -a "$log"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl >> "$log" 2>&1 || { stamp "wheels failed"; exit 3; }
export PYTHONPATH="/tmp/site:$PWD" XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee -a "$log"
python3 -c "import jax, torch; print('jax', jax.__version__, jax.devices(), 'torch', torch.__version__)" 2>&1 | tee -a "$log"
git_rev=$(cat .lease_commit 2>/dev/null); stamp "tree at ${git_rev:-unknown}"
stamp "tests"
python3 -m benchmarks.gpu_run --out "$D/tests" --steps tests --minutes 1.0 2>&1 | tee -a "$log"
tail -n 40 "$D/tests/pytest.log" >> "$log" 2>/dev/null; pack
stamp "attention"
python3 -m benchmarks.gpu_run --out "$D" --steps attention --minutes 3.3 \
    --attention-args "--batches 8 --lengths 4096 16384 65536 --dtypes bfloat16 float32 --repeats 5" 2>&1 | tee -a "$log"
pack
stamp "long_context (decoding and training steps; untrained parameters)"
timeout 110 python3 -m benchmarks.long_context --workdir /tmp/no_workdir --out "$D/long_context" \
    --device-counts 1 --repeats 3 --lengths 4096 16384 65536 --crossover-lengths \
    --skip perplexity --implementation pallas_triton > "$D/long_context.log" 2>&1
stamp "long_context exit $?"; tail -n 30 "$D/long_context.log" >> "$log"; pack
left=$(( 560 - ($(date +%s) - t0) ))
if false; then
    stamp "fwht ($left s left)"
    python3 -m benchmarks.gpu_run --out "$D/fwht" --steps fwht --minutes "$(python3 -c "print(($left - 15) / 60)")" \
        --fwht-args "--dtypes float32 bfloat16 --sizes 1024 8192 16384 32768" 2>&1 | tee -a "$log"
fi
stamp "done"; pack
