"""The ``impala-lab`` command (`main.main`): train, play, notebooks and config.

Nothing is imported here, so ``python -m impala_lab.cli.main`` runs without a warning.
"""
