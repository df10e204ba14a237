"""Training for the studies: the trainer (``trainer``: resumable, data-parallel runs of a
``Task``), its checkpoints (``checkpoints``) and metrics log (``metrics_log``), and evolution
strategies (``es``)."""
