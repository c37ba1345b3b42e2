"""What each figure of ``Impala.stats()`` is called (`LABELS`), so that every view names it
alike; `QUEUES` and `queue_figures`: the buffers the gauges show. Pure Python."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Label:
    """How one figure is named: its flat stats ``key`` (a ``metrics.csv`` column, or a
    `queue_figures` name), the dashboard's ``name``, the terminal's ``short``, its ``unit``,
    one line of ``help``, and its plot ``legend`` ("": the name)."""

    key: str
    name: str
    short: str
    unit: str
    help: str
    legend: str = ""

    @property
    def legend_name(self) -> str:
        """The plot legend's text."""
        return self.legend or self.name


LABELS: dict[str, Label] = {label.key: label for label in (
    # the headline figures (docs/training.md, "Logged metrics explained", says more)
    Label("sample_throughput", "sampled", "sample", "env steps/s", "env steps sampled per s"),
    Label("train_throughput", "trained", "train", "env steps/s", "samples trained on per s"),
    Label("episode_return_mean", "return (last 100)", "return", "",
          "mean return of the last 100 episodes", legend="return"),
    Label("evaluation", "eval return", "eval", "", "the latest evaluation: greedy / sampled"),
    Label("evaluation.episode_return_mean_greedy", "eval return (greedy)", "eval", "",
          "the latest evaluation's mean return, greedy", legend="eval greedy"),
    Label("evaluation.episode_return_mean_sampled", "eval return (sampled)", "eval~", "",
          "the latest evaluation's mean return, sampled", legend="eval sampled"),
    Label("num_steps_sampled", "env steps", "steps", "env steps", "env steps sampled in all"),
    Label("weights_version", "weights", "weights", "versions", "train steps applied"),
    Label("policy_lag.mean", "policy lag", "lag", "updates",
          "a batch's lag when it reaches the driver", legend="policy lag (updates)"),
    Label("policy_lag_at_training.mean", "lag at training", "t.lag", "updates",
          "a batch's lag when the learner trains on it", legend="lag at training (updates)"),
    Label("learner_queue.mean", "learner queue", "queue", "batches",
          "batches left in the learner queue after a step", legend="learner queue (batches)"),
    Label("time_total_s", "time", "time", "s", "seconds since the run was built"),
    # the timing breakdown, in pipeline order: mean ms over the last 10 operations
    Label("timing_breakdown.optimizer_step_time_ms", "driver step", "step", "ms",
          "one turn of the driver's loop"),
    Label("timing_breakdown.batch_concat_time_ms", "concat", "concat", "ms",
          "concatenating sample batches into a train batch"),
    Label("timing_breakdown.broadcast_time_ms", "broadcast", "bcast", "ms",
          "publishing fresh weights to the workers"),
    Label("timing_breakdown.learner_dequeue_time_ms", "dequeue", "dequeue", "ms",
          "the learner taking a train batch from its queue"),
    Label("timing_breakdown.learner_load_time_ms", "load", "load", "ms",
          "loading a train batch onto the learner's devices"),
    Label("timing_breakdown.learner_load_wait_time_ms", "load wait", "wait", "ms",
          "the learner waiting for a loaded buffer"),
    Label("timing_breakdown.learner_grad_time_ms", "grad", "grad", "ms",
          "the learner's gradient step"),
    # the last train step's learner stats
    Label("learner.total_loss", "total loss", "loss", "", "what the learner minimizes"),
    Label("learner.policy_loss", "policy loss", "pi", "", "the policy-gradient loss",
          legend="policy"),
    Label("learner.vf_loss", "value loss", "vf", "", "the value function's loss",
          legend="value"),
    Label("learner.entropy", "entropy", "ent", "nats", "the policy's entropy, per sample"),
    Label("learner.grad_gnorm", "grad norm", "gnorm", "", "the gradient's norm before clipping"),
    Label("learner.mean_rho", "mean rho", "rho", "", "mean importance weight; 1 is on-policy"),
    Label("learner.vf_explained_var", "vf explained var", "expl.var", "",
          "the share of the returns' variance the value function explains"),
    # Box actions only (a Gaussian policy), averaged over the train batch
    Label("learner.action_mean", "action mean", "mean", "", "the policy's mean action",
          legend="mean"),
    Label("learner.action_std", "action std", "std", "", "the policy's standard deviation",
          legend="std"),
)}


#: The evaluation's returns (greedy, sampled): beside the actors' return in plots and cards.
EVAL_KEYS = ("evaluation.episode_return_mean_greedy", "evaluation.episode_return_mean_sampled")


def group(prefix: str) -> dict[str, Label]:
    """The labels under ``prefix.``, keyed by the rest: ``group("learner")["entropy"]``."""
    start = prefix + "."
    return {key[len(start):]: label for key, label in LABELS.items() if key.startswith(start)}


#: ``stats()["timing_breakdown"]`` keys -> labels, in pipeline order, and their bars' colours.
TIMERS: dict[str, Label] = group("timing_breakdown")
TIMER_COLORS = ("#555555", "#d35400", "#218a3b", "#c0392b", "#8e44ad", "#7f8c8d", "#1f77b4")
#: The learner's stats of a Box-action run only (a Gaussian policy): key -> label.
ACTIONS: dict[str, Label] = {key: group("learner")[key]
                             for key in ("action_mean", "action_std")}
#: ``stats()["learner"]`` keys of every run -> labels, in the order the views list them.
LEARNER: dict[str, Label] = {key: label for key, label in group("learner").items()
                             if key not in ACTIONS}

#: The buffers along the pipeline, by `queue_figures` name, in the data's order.
QUEUES: dict[str, Label] = {label.key: label for label in (
    Label("in_flight", "requests in flight", "in flight", "requests",
          "sample requests in flight over all workers"),
    Label("replay", "replay store", "replay", "batches", "batches stored for replay"),
    Label("batch_buffer", "batch buffer", "buffer", "env steps",
          "env steps waiting to be concatenated into a train batch"),
    Label("learner_queue", "learner queue", "queue", "batches",
          "train batches waiting for the learner"),
    Label("minibatch", "minibatch ring", "ring", "slots",
          "occupied slots of the learner's minibatch ring"),
)}


def queue_figures(stats: Mapping[str, Any]) -> dict[str, tuple[float, float]]:
    """``(level, capacity)`` of every buffer in `QUEUES` (0 where the run reports none)."""
    p = stats.get("pipeline") or {}
    in_flight = p.get("in_flight") or {}
    slots = p.get("minibatch_slots") or []
    return {
        "in_flight": (float(sum(in_flight.values())),
                      float(p.get("num_workers", 0) * p.get("max_in_flight", 0))),
        "replay": (float(p.get("replay_stored", 0)), float(p.get("replay_capacity", 0))),
        "batch_buffer": (float(p.get("batch_buffer_steps", 0)),
                         float(p.get("train_batch_size", 0))),
        "learner_queue": (float(p.get("learner_queue_len", 0)),
                          float(p.get("learner_queue_size", 0))),
        "minibatch": (float(sum(1 for occupied, _ in slots if occupied)), float(len(slots))),
    }
