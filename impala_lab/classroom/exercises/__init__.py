"""Checkers for the classroom exercises in ``notebooks/exercises/``.

A notebook's student code goes between the markers (`MARK_START`, `MARK_END`); its last cell
calls the checker, which runs the answer, then the library's reference, on seeded cases and
prints the pass line or the first case that differs (inputs, where, expected, actual, a hint).
It returns a `CheckResult` and never raises for a wrong answer.

`EXERCISES` names each exercise's notebook, answer and checker; each has a harder challenge
(``<name>_challenge``, `impala_lab.classroom.exercises.challenges`). The instructors' grader
(``impala_lab_grader``, docs/grading.md) uses these specs. Never imports TensorFlow.
"""

from __future__ import annotations

from dataclasses import dataclass

from impala_lab.classroom.exercises._common import (
    MARK_END,
    MARK_START,
    CheckResult,
    fast_mode,
)
from impala_lab.classroom.exercises.challenges import (
    check_diag_gaussian_challenge,
    check_driver_step_challenge,
    check_lstm_unroll_challenge,
    check_minibatch_get_challenge,
    check_replay_mix_challenge,
    check_vtrace_loss_challenge,
    check_vtrace_numpy_challenge,
)
from impala_lab.classroom.exercises.diag_gaussian import check_diag_gaussian
from impala_lab.classroom.exercises.driver_step import check_driver_step
from impala_lab.classroom.exercises.lstm_unroll import check_lstm_unroll
from impala_lab.classroom.exercises.minibatch_get import check_minibatch_get
from impala_lab.classroom.exercises.replay_mix import check_replay_mix
from impala_lab.classroom.exercises.vtrace_loss import check_vtrace_loss
from impala_lab.classroom.exercises.vtrace_numpy import check_vtrace_numpy

__all__ = ["CheckResult", "Exercise", "EXERCISES", "MARK_START", "MARK_END", "fast_mode",
           "check_minibatch_get", "check_replay_mix", "check_vtrace_numpy",
           "check_driver_step", "check_vtrace_loss", "check_lstm_unroll",
           "check_diag_gaussian",
           "check_minibatch_get_challenge", "check_replay_mix_challenge",
           "check_vtrace_numpy_challenge", "check_driver_step_challenge",
           "check_vtrace_loss_challenge", "check_lstm_unroll_challenge",
           "check_diag_gaussian_challenge"]


@dataclass(frozen=True)
class Exercise:
    """One exercise: its notebook (same name in exercises/ and solutions/), the name the
    notebook gives the answer, and for a challenge its exercise (``base``)."""

    name: str
    title: str
    notebook: str
    answer: str
    base: str = ""

    @property
    def checker(self) -> str:
        """Its checker's name in this package."""
        return f"check_{self.name}"


def _challenge(base: Exercise, title: str) -> Exercise:
    name = f"{base.name}_challenge"
    return Exercise(name, f"{title} (challenge)", f"{base.notebook[:3]}c_{name}.ipynb",
                    base.answer, base.name)


_BASES = (
    Exercise("minibatch_get", "MinibatchBuffer.get", "ex1_minibatch_buffer_get.ipynb",
             "MyMinibatchBuffer"),
    Exercise("replay_mix", "ReplayMixer.mix", "ex2_replay_mixer.ipynb", "mix"),
    Exercise("vtrace_numpy", "V-trace in numpy", "ex3_vtrace_numpy.ipynb", "vtrace"),
    Exercise("driver_step", "the driver loop's step", "ex4_driver_step.ipynb", "driver_step"),
    Exercise("vtrace_loss", "the V-trace loss", "ex5_vtrace_loss.ipynb", "vtrace_loss"),
    Exercise("lstm_unroll", "the masked LSTM unroll", "ex6_lstm_unroll.ipynb", "lstm_unroll"),
    Exercise("diag_gaussian", "the diagonal Gaussian's log-prob and entropy",
             "ex7_diag_gaussian.ipynb", "logp_and_entropy"),
)
EXERCISES: dict[str, Exercise] = {e.name: e for e in (*_BASES, *map(_challenge, _BASES, (
    "the minibatch ring from scratch", "the replay mixer from its rule",
    "V-trace without a loop", "the driver's step from its invariants",
    "the V-trace loss, V-trace included", "the LSTM unroll with masks",
    "the Gaussian from its density, no loop")))}
