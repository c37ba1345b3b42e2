"""`KnobControl` (an `Impala` mixin): a run's live knobs (`impala_lab.knobs`) and its
learning-rate schedule. A change is validated at once and applied before the driver's next
step; with ``lr_schedule`` the rate follows the schedule and the ``lr`` knob is refused.
"""

from __future__ import annotations

from typing import Any

from impala_lab.errors import ConfigError
from impala_lab.knobs import KNOBS, LIVE_KNOBS
from impala_lab.schedules import scheduled_value

__all__ = ["KnobControl"]

# The scheduled rate is assigned once it moved this much (relative), or reached its end.
LR_STEP = 0.002


class KnobControl:
    """Live knobs and the lr schedule of an `Impala` run (which sets ``config``, ``policy``,
    ``learner``, ``loop``, ``supervisor``, ``knob_changes``, ``_pending_knobs`` and
    ``_knob_lock``)."""

    _scheduled_lr: float | None = None  # the last rate the schedule assigned

    def set_knobs(self, **knobs: Any) -> None:
        """Change knobs that are safe between steps; applied by the driver before its next step
        (at once when no learner thread runs).

        Live knobs (`impala_lab.knobs.KNOBS`):
{knobs}

        Raises:
          ConfigError: a name that is not a live knob, or an invalid value (nothing changes).
        """
        for name, value in knobs.items():
            if name not in KNOBS:
                raise ConfigError(f"{name!r} cannot change during a run; live knobs are "
                                  f"{', '.join(LIVE_KNOBS)}")
            if name == "lr" and self.config.lr_schedule is not None:
                raise ConfigError(
                    f"lr={value!r} cannot be set: this run's learning rate follows its "
                    f"lr_schedule {list(map(list, self.config.lr_schedule))}; restore or start "
                    "a run with lr_schedule=None to set lr by hand")
            self.config.validate_field(name, value)
        with self._knob_lock:
            self._pending_knobs.update(knobs)
        if self.learner.ident is None:  # nothing runs in the background: apply now
            self._apply_pending_knobs()

    if set_knobs.__doc__:  # None under python -OO
        set_knobs.__doc__ = set_knobs.__doc__.format(knobs="\n".join(
            f"          {k.name} ({k.kind}): {k.help}" for k in KNOBS.values()))

    def _apply_pending_knobs(self) -> None:
        """Apply the queued knob changes, and the schedule's rate for the env steps so far."""
        if self.config.lr_schedule is not None:
            self._follow_lr_schedule()
        with self._knob_lock:
            pending, self._pending_knobs = self._pending_knobs, {}
        if not pending:
            return
        config = self.config.replace(**pending)
        self.config = self.loop.config = self.supervisor.config = config  # one for all parts
        for name, value in pending.items():
            knob = KNOBS[name]
            if knob.apply is not None:
                knob.apply(self, value)
            self.knob_changes.append({"time_s": self.elapsed_s,
                                      "num_steps_sampled": self.num_steps_sampled,
                                      "knob": name, "value": value})

    def _follow_lr_schedule(self) -> None:
        lr = scheduled_value(self.config.lr_schedule, self.num_steps_sampled)
        last = self._scheduled_lr
        end = self.config.lr_schedule[-1][1]
        if last is None or abs(lr - last) > LR_STEP * last or (lr == end and last != end):
            self.policy.set_lr(lr)
            self._scheduled_lr = lr
