"""Config-driven experiments: one package per study, measuring apart from reporting, on one
core (``experiments.core``: statistics, the verdict rule, the sweep runner, records, config
validation, outputs and the trainer).

Each study package ``experiments.<name>`` provides

* ``validate_config(config)``: raises ``ValueError``/``TypeError`` naming the field, the value
  and what is allowed; ``experiments.main.run_experiment`` calls it (after checking every
  field's type against ``configs/<name>.py``, the claims the config declares and the trainer
  options) before anything runs;
* ``measure(config, workdir) -> records``: the computation only. It returns plain JSON data,
  stored as ``workdir/records.json``, and writes nothing but what a resumable computation needs
  (sweep records, training checkpoints and metrics under ``workdir``);
* ``report(records, config, workdir) -> dict``: tables (CSV/JSON), figures (PNG), the
  verdicts (``verdicts.json``, by ``experiments.core.verdicts`` from the claims the config
  declares) and ``summary.md`` from the study's template ``experiments/<name>/summary.md``, so
  paper commentary lives in text and verdict prose in the core, not in the study;
* optionally ``headline(records)`` (the numbers a command-line ablation compares),
  ``SEED_FIELD`` (the config field an ablation's seed sets) and, for a study whose run trains
  several seeds from that field, ``one_seed(config)`` (the config training that seed alone:
  an ablation's seeds must not share runs);

and declares ``STUDY`` (``experiments.core.study.Study``: its paper, its place on the results page
and what it reproduces). ``python -m experiments.main --config=configs/<name>.py[:variant]
[,key=value...]`` runs one; ``python -m experiments.regenerate`` rewrites the committed reports
from their records; ``python -m experiments.results_page`` collates RESULTS.md and the README's
table of studies. Nothing lists the studies: a new study is its package and its config.
"""
