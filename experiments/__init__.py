"""Config-driven experiments: one module per experiment with ``run(config, workdir)``."""
