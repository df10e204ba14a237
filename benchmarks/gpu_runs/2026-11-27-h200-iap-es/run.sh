#!/bin/bash
# The IAP ES pair's extra paired seeds on a lent GPU (issue 30 point 5): every seed of
# configs/iap_es.py:pair without a record, 95 seeds of a kind in one vmapped program.
# Run from the repository root on the device machine, with .whl carried; $OUT comes back.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:. XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
W=/tmp/iap_es_pair
mkdir -p $W && cp -r results/iap_es_pair/runs $W/
python3 - > $OUT/environment.json <<'PY'
import json, subprocess, jax
d = jax.devices()[0]
print(json.dumps({"jax": jax.__version__, "device_kind": d.device_kind,
  "nvidia_smi": subprocess.run(["nvidia-smi"], capture_output=True, text=True).stdout}, indent=1))
PY
pack() {  # the new cells' records and metrics, not the committed seeds'
  (cd $W && find runs -newer $OUT/environment.json -type f \
     \( -name result.json -o -name metrics.jsonl \) | tar czf $OUT/runs.tgz.tmp -T - ) \
    && mv $OUT/runs.tgz.tmp $OUT/runs.tgz
}
( while sleep 20; do pack; done ) &
PACKER=$!
start=$(date +%s)
timeout ${BUDGET_S:-480} python3 -m experiments.main --config=configs/iap_es.py:pair \
  --config.seeds_together=95 --workdir=$W > $OUT/run.log 2>&1
echo "exit $? after $(( $(date +%s) - start )) s" | tee -a $OUT/run.log
kill $PACKER; pack
uptime >> $OUT/run.log
ls $W/runs | wc -l
tail -5 $OUT/run.log
