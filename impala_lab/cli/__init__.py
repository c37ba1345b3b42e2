"""The ``impala-lab`` command: train, play, notebooks, config and report.

`main.main` parses the command line (the console script ``impala-lab`` and
``python -m impala_lab.cli`` both call it); `train` runs ``impala-lab train`` and writes its
outputs; `progress` draws its progress view; `play` renders a checkpoint's policy as a GIF.
Nothing is imported here, so ``python -m impala_lab.cli.main`` runs without a warning.
"""
