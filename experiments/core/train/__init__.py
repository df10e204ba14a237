"""Training for the studies: the trainer (``trainer``: resumable, data-parallel runs of a
``Task``), its checkpoints (``checkpoints``), metrics log (``metrics_log``) and device layout
(``distributed``: the data x seq mesh, batch placement, evaluation on every device), and
evolution strategies (``es``)."""
