"""Experiment configs: ``get_config(arg)`` per file; ``arg="quick"`` gives the smoke-test size."""
