#!/bin/bash
# configs/lstm_lm.py:paper on a lent GPU, cut to 3 arms x 1 seed x 3,000 steps (of the
# variant's 106,160), to measure its training speed on an accelerator. $OUT comes back.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:. XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
W=/tmp/lstm_paper
python3 -c "import jax; print(jax.__version__, jax.devices())" > $OUT/environment.txt
nvidia-smi >> $OUT/environment.txt
start=$(date +%s)
timeout ${BUDGET_S:-300} python3 -m experiments.main --config=configs/lstm_lm.py:paper \
  --config.arms="('normalised:exact','normalised:favor+','normalised:angular')" \
  --config.seeds="(0,)" --config.train.num_train_steps=3000 \
  --config.train.eval_every_steps=3000 --config.train.checkpoint_every_steps=3000 \
  --workdir=$W > $OUT/run.log 2>&1
echo "exit $? after $(( $(date +%s) - start )) s" | tee -a $OUT/run.log
uptime >> $OUT/run.log
cp $W/summary.md $W/records.json $OUT/ 2>/dev/null
(cd $W && tar czf $OUT/runs.tgz runs --exclude checkpoints)
tail -3 $OUT/run.log
