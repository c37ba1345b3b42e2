"""Checkers for the classroom exercises in ``notebooks/exercises/``.

Each exercise notebook has one cell where the student's code goes between the markers::

    # ---- YOUR CODE STARTS HERE ----
    raise NotImplementedError("...")
    # ---- YOUR CODE ENDS HERE ----

and a last cell that calls the exercise's checker on the answer. A checker runs the answer
and the library's reference on seeded cases and prints either the pass line::

    ✓ minibatch_get: all 7 cases pass

or the first case that differs: its inputs, where it differs, the expected and the actual
value, and a hint. It returns a `CheckResult` (truthy when passed) and never raises for a
wrong answer, so a student always sees the message.

Exercise, the answer the student writes, its checker and the reference it is compared with:

- ``minibatch_get``: a ``MinibatchBuffer`` subclass with ``get()``; `check_minibatch_get`;
  ``MinibatchBuffer.get``.
- ``replay_mix``: ``mix(pairs, store, replay_proportion, replay_threshold, rng)``;
  `check_replay_mix`; ``ReplayMixer.mix``.
- ``vtrace_numpy``: ``vtrace(log_rhos, discounts, rewards, values, bootstrap_value,
  clip_rho_threshold, clip_pg_rho_threshold)``; `check_vtrace_numpy`;
  ``vtrace.from_importance_weights_numpy``.
- ``driver_step``: ``driver_step(driver, timeout)``; `check_driver_step`; ``DriverLoop.step``.
- ``vtrace_loss``: ``vtrace_loss(target_logits, values, bootstrap_value, batch, config)``;
  `check_vtrace_loss`; ``VTracePolicy.loss_and_stats``.

``python -m impala_lab.exercises NOTEBOOK.ipynb ...`` checks handed-in notebooks (see
`impala_lab.exercises.notebook`). Importing this package does not import TensorFlow; the
V-trace checkers import it when they first need the reference.
"""

from __future__ import annotations

from dataclasses import dataclass

from impala_lab.exercises._common import (
    MARK_END,
    MARK_START,
    CheckResult,
    fast_mode,
)
from impala_lab.exercises.driver_step import check_driver_step
from impala_lab.exercises.minibatch_get import check_minibatch_get
from impala_lab.exercises.replay_mix import check_replay_mix
from impala_lab.exercises.vtrace_loss import check_vtrace_loss
from impala_lab.exercises.vtrace_numpy import check_vtrace_numpy

__all__ = ["CheckResult", "Exercise", "EXERCISES", "MARK_START", "MARK_END", "fast_mode",
           "check_minibatch_get", "check_replay_mix", "check_vtrace_numpy",
           "check_driver_step", "check_vtrace_loss"]


@dataclass(frozen=True)
class Exercise:
    """One exercise: its notebook (same name in exercises/ and solutions/), the name the
    notebook gives the answer, and the checker's name in this package."""

    name: str
    title: str
    notebook: str
    answer: str
    checker: str


EXERCISES: dict[str, Exercise] = {e.name: e for e in (
    Exercise("minibatch_get", "MinibatchBuffer.get", "ex1_minibatch_buffer_get.ipynb",
             "MyMinibatchBuffer", "check_minibatch_get"),
    Exercise("replay_mix", "ReplayMixer.mix", "ex2_replay_mixer.ipynb", "mix",
             "check_replay_mix"),
    Exercise("vtrace_numpy", "V-trace in numpy", "ex3_vtrace_numpy.ipynb", "vtrace",
             "check_vtrace_numpy"),
    Exercise("driver_step", "the driver loop's step", "ex4_driver_step.ipynb", "driver_step",
             "check_driver_step"),
    Exercise("vtrace_loss", "the V-trace loss", "ex5_vtrace_loss.ipynb", "vtrace_loss",
             "check_vtrace_loss"),
)}
