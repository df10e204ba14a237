"""Config-driven experiments: one module per experiment, measuring apart from reporting.

Each experiment module ``experiments.<name>`` provides

* ``validate_config(config)``: raises ``ValueError``/``TypeError`` naming the field, the value
  and what is allowed; ``experiments.main.run_experiment`` calls it (after checking every
  field's type against ``configs/<name>.py`` and the trainer options) before anything runs;
* ``measure(config, workdir) -> results``: the computation only. It returns plain data (dicts,
  lists and NumPy arrays) and writes nothing but what a resumable computation needs (training
  checkpoints and metrics under ``workdir``);
* ``report(results, config, workdir) -> dict``: tables (CSV/JSON), figures (PNG) and
  ``summary.md`` from ``results``; the paper's claim, our numbers and the verdict come from the
  summary template ``experiments/templates/<name>.md`` (``outputs.render_summary``), so paper
  commentary lives in text, not code;
* ``run(config, workdir)``: ``report(measure(config, workdir), config, workdir)``.

``python -m experiments.main --config=configs/<name>.py[:variant][,key=value...]`` runs one.
"""
