"""Environments that ship with impala_lab: a memory task and MinAtar's games from pixels.

Importing the package registers ``impala_lab/StatelessCartPole-v1`` and, when MinAtar is
installed, ``MinAtar/<Game>-v1`` with gymnasium.
"""
