"""The ``impala-lab`` command: train, play, notebooks and report (`main.main`)."""

from impala_lab.cli.main import main

__all__ = ["main"]
