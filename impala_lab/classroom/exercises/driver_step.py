"""Exercise 4: the driver's loop, one turn of RLlib's ``AsyncSamplesOptimizer._step``.

The student writes ``driver_step(driver, timeout) -> (sample_timesteps, train_timesteps)``, a
drop-in for `impala_lab.driver.driver_loop.DriverLoop.step`. The checker runs it and the
library's step on twin seeded `StepDriver`s and compares each step's calls, counts and state.
"""

from __future__ import annotations

import queue
import random
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np

from impala_lab.classroom.exercises._common import (
    AnswerRaised,
    Case,
    CheckResult,
    Mismatch,
    call_answer,
    loaded,
    same,
    verbatim,
    window,
)
from impala_lab.classroom.exercises._guard import Raised, portable
from impala_lab.classroom.exercises._spec import Spec, run_check
from impala_lab.driver.driver_loop import DriverLoop
from impala_lab.learner.port import UpdateFlag


@dataclass(eq=False)
class FakeWorker:
    """A worker handle: an index, a width B and the weights version it holds."""

    index: int
    num_envs: int
    weights_version: int = -1

    def __repr__(self) -> str:
        return f"worker{self.index}"


class FakeLearner:
    """A `LearnerPort` whose updates the checker scripts between driver steps."""

    def __init__(self) -> None:
        self.inqueue: queue.Queue = queue.Queue()
        self.version = 0
        self._trained = 0  # env steps trained since the last drain_trained()
        self._updated = UpdateFlag()

    def put_batch(self, batch: Any, timeout: float) -> bool:
        self.inqueue.put(batch)
        return True

    def drain_trained(self) -> int:
        trained, self._trained = self._trained, 0
        return trained

    def take_weights_updated(self) -> bool:
        return self._updated.take()

    @property
    def weights_version(self) -> int:
        return self.version

    def get_weights(self) -> tuple[list, int]:
        return [], self.version

    def raise_if_failed(self) -> None:
        return None

    def is_alive(self) -> bool:
        return True

    def train(self, n: int) -> None:
        """Train on the first ``n`` queued batches: one update each."""
        for _ in range(n):
            self._trained += self.inqueue.get_nowait().count
            self.version += 1
            self._updated.set()


def batch_names(batch: Any) -> list[str]:
    """Names of the sample batches a (train) batch is made of, in column order."""
    obs = np.asarray(batch.obs)
    return [f"b{int(obs[0, b, 0])}" for b in range(obs.shape[1]) if obs[0, b, 1] == 0]


class StepDriver(DriverLoop):
    """A `DriverLoop` with scripted workers and learner, a real `ReplayMixer`, and no
    TensorFlow; the calls a step makes are scripted and logged in ``events``."""

    def __init__(self, params: dict[str, Any]) -> None:
        from impala_lab.driver.replay_mixer import ReplayMixer
        from impala_lab.driver.run_stats import RunStats

        config = SimpleNamespace(
            train_batch_size=params["train"], broadcast_interval=params["interval"],
            sample_batch_size=params["T"], replay_proportion=params["rp"],
            replay_buffer_num_slots=params["slots"],
            max_sample_requests_in_flight_per_worker=params["in_flight"])
        replay = ReplayMixer(params["rp"], params["slots"], params["train"], params["T"],
                             seed=params["seed"])
        super().__init__(config, replay, FakeLearner(), RunStats())
        self.events: list[str] = []
        self._T = params["T"]
        self._rng = random.Random(params["seed"])  # which requests finish in each step
        self._learner_rng = random.Random(params["seed"] + 1000)
        self._serial = 0
        self._pending: list[tuple[FakeWorker, Any]] = []
        self.workers = [FakeWorker(i, b) for i, b in enumerate(params["widths"])]
        self.broadcast()
        for worker in self.workers:
            self.send_weights_and_request(worker, initial=True)
        self.events.clear()

    def make_batch(self, width: int, version: int = 0) -> Any:
        """A `SampleBatch` [T, width] named ``b<serial>`` (serials count up from 0)."""
        from impala_lab.batch import SampleBatch

        T, B = self._T, width
        obs = np.zeros((T, B, 2), np.float32)
        obs[:, :, 0] = self._serial
        obs[:, :, 1] = np.arange(B)
        self._serial += 1
        return SampleBatch(
            obs=obs, actions=np.zeros((T, B), np.int64), rewards=np.zeros((T, B), np.float32),
            terminateds=np.zeros((T, B), bool), truncateds=np.zeros((T, B), bool),
            truncation_values=np.zeros((T, B), np.float32),
            behaviour_logits=np.zeros((T, B, 2), np.float32),
            bootstrap_obs=np.zeros((B, 2), np.float32),
            policy_versions=np.full(B, version, np.int64),
            episode_returns=np.zeros(0, np.float64), episode_lengths=np.zeros(0, np.int64))

    def completed_samples(self, timeout: float) -> Any:
        # Decided at the first next(), like the task pool: requests added meanwhile wait.
        done = []
        if self._pending:
            k = self._rng.randint(1, len(self._pending))
            for _ in range(k):
                workers = sorted({w.index for w, _ in self._pending})
                index = self._rng.choice(workers)
                j = next(i for i, (w, _) in enumerate(self._pending) if w.index == index)
                done.append(self._pending.pop(j))
        yield from done

    def put_on_learner_queue(self, train_batch: Any) -> None:
        self.events.append(f"put([{', '.join(batch_names(train_batch))}])")
        self.learner.put_batch(train_batch, timeout=0.0)
        self.run_stats.num_train_batches += 1

    def record_sample(self, batch: Any) -> None:
        self.events.append(f"record({batch_names(batch)[0]})")

    def broadcast(self) -> None:
        self.events.append(f"broadcast(v{self.learner.version})")
        self.weights_ref = self.learner.version
        self.num_sent = 0
        self.run_stats.num_broadcasts += 1

    def send_weights_and_request(self, worker: FakeWorker, initial: bool = False) -> None:
        self.events.append(f"send({worker}, v{self.weights_ref})")
        worker.weights_version = self.weights_ref
        self.run_stats.num_weight_syncs += 1
        n = self.config.max_sample_requests_in_flight_per_worker if initial else 1
        for _ in range(n):
            self._pending.append(
                (worker, self.make_batch(worker.num_envs, worker.weights_version)))

    def run_learner(self) -> None:
        """The scripted learner: trains on some of the queued batches, as a thread would."""
        self.learner.train(self._learner_rng.randint(0, self.learner.inqueue.qsize()))

    def state(self) -> dict[str, Any]:
        names = []
        for b in self.batch_buffer:
            try:
                names.append(batch_names(b)[0])
            except Exception:
                names.append(repr(b))
        return {"batch_buffer": names, "batch_buffer_steps": self.batch_buffer_steps,
                "num_sent": self.num_sent}


def _params(widths: tuple[int, ...], T: int, train: int, interval: int, rp: float, slots: int,
            seed: int, steps: int = 0) -> dict[str, Any]:
    return {"widths": tuple(widths), "T": T, "train": train, "interval": interval, "rp": rp,
            "slots": slots, "steps": steps, "seed": seed, "in_flight": 2}


def make_step_driver(widths: tuple[int, ...] = (1, 1), T: int = 2, train_batch_size: int = 4,
                     broadcast_interval: int = 1, replay_proportion: float = 0.0,
                     replay_buffer_num_slots: int = 0, seed: int = 0) -> StepDriver:
    """A `StepDriver` to try a step on: one worker per entry of `widths` (its B), two requests
    in flight per worker; ``run_learner()`` between steps trains on some queued batches."""
    return StepDriver(_params(widths, T, train_batch_size, broadcast_interval,
                              replay_proportion, replay_buffer_num_slots, seed))


# name, widths, T, train_batch_size, broadcast_interval, replay, slots, steps, seed, hint
_CASES = [
    ("two workers, a train batch of two samples", (1, 1), 2, 4, 1, 0.0, 0, 6, 0,
     "This case catches a turn that skips or reorders a part. Follow RLlib's loop: for each "
     "(worker, batch) of driver.replay.mix(driver.completed_samples(timeout)): buffer it, "
     "maybe put a train batch, then (new batches only) record, maybe broadcast, send weights "
     "and a request."),
    ("workers of widths B = 1, 2, 3; train batch not a multiple", (1, 2, 3), 2, 9, 1, 0.0, 0,
     8, 1, "This case catches counting batches instead of env steps. Count env steps "
     "(batch.count = T * B), not batches: the buffer goes to the learner once it holds >= "
     "train_batch_size env steps, however far past it."),
    ("broadcast_interval = 3", (1, 1), 2, 4, 3, 0.0, 0, 10, 2,
     "This case catches a broadcast on every update, or the flag taken before the interval "
     "is reached. Broadcast only when driver.num_sent >= broadcast_interval and then "
     "driver.learner.take_weights_updated() is True; num_sent counts the batches answered "
     "since the last broadcast."),
    ("replay_proportion = 1.0", (1, 2), 2, 6, 1, 1.0, 6, 8, 3,
     "This case catches replays counted as sampled, recorded or answered. Replayed batches "
     "(worker is None) go into the batch buffer but are not counted as sampled, not "
     "recorded, and get no weights and no new request."),
    ("three workers, replay 0.5, broadcast_interval 2", (2, 1, 1), 3, 12, 2, 0.5, 8, 10, 4,
     "This case catches slips that show only together: replays, an interval, uneven widths."),
]


def _window(events: list[str], i: int) -> str:
    return window(events, i, 4, 3, "(no more calls in this step)")


def _event_hint(expected: str | None, actual: str | None) -> str:
    exp_kind = expected.split("(")[0] if expected else None
    act_kind = actual.split("(")[0] if actual else None
    if exp_kind == "put" and act_kind == "put":
        return ("The train batch holds different sample batches: concat_samples(batch_buffer) "
                "of every batch in arrival order, replays included, then empty the buffer.")
    if exp_kind == "put":
        return ("A train batch is due here: append every batch (new or replayed) to "
                "driver.batch_buffer and add batch.count to driver.batch_buffer_steps; once "
                "that is >= config.train_batch_size, put concat_samples(driver.batch_buffer) "
                "with driver.put_on_learner_queue(...) and reset the buffer and its count.")
    if act_kind == "put":
        return ("Put a train batch only once the buffered env steps reach "
                "config.train_batch_size, and check right after appending each batch.")
    if exp_kind == "record":
        return ("Call driver.record_sample(batch) for each new batch (worker is not None), "
                "before the broadcast check: it counts episodes and the policy lag.")
    if act_kind == "record":
        return ("Replayed batches (worker is None) are not recorded; `continue` right after "
                "buffering them.")
    if exp_kind == "broadcast":
        return ("Broadcast here: when driver.num_sent >= config.broadcast_interval and "
                "driver.learner.take_weights_updated() is True, call driver.broadcast() before "
                "sending weights to this worker. Take the flag only once the interval is "
                "reached: taking it clears it, so a take that does not broadcast loses it.")
    if act_kind == "broadcast":
        return ("No broadcast here: broadcast only when driver.num_sent >= "
                "config.broadcast_interval and driver.learner.take_weights_updated() is True "
                "(broadcast() resets num_sent; the take clears the flag).")
    if exp_kind == "send" and act_kind == "send":
        return ("The right worker must get the weights and the request: the one that "
                "returned this batch.")
    if exp_kind == "send":
        return ("Answer each new batch: driver.num_sent += 1, then "
                "driver.send_weights_and_request(worker), which sends the current weights "
                "and a new sample request to the worker that returned it.")
    return "Make the same calls as RLlib's loop, in the same order."


def _steps(step: Any, case: Case, answer: bool = True) -> list[Any]:
    """`step(driver, 0.0)` for the case's steps on a `StepDriver`, the scripted learner
    between them: one record per step (its calls, what it returned, the state after it); a
    `Raised` ends the list."""
    p = case.params
    driver = StepDriver(p)
    records: list[Any] = []
    for _ in range(p["steps"]):
        try:
            out = call_answer(step, driver, 0.0)
        except AnswerRaised as raised:
            if not answer:
                raise raised.exc from None
            records.append(Raised.of(raised))
            break
        if isinstance(out, list):
            out = tuple(out)
        records.append({"events": list(driver.events), "out": portable(out),
                        "state": portable(driver.state())})
        driver.events.clear()
        driver.run_learner()
    return records


def _reference_trace(case: Case) -> list[Any]:
    return _steps(DriverLoop.step, case, answer=False)


def _compare(case: Case, expected: list[Any], actual: list[Any]) -> None:
    for step, (ref, ans) in enumerate(zip(expected, actual), start=1):
        if isinstance(ans, Raised):
            raise ans
        ref_events, ans_events = ref["events"], ans["events"]
        if ref_events and not ans_events:
            raise Mismatch(f"step {step}: the calls the driver makes",
                           verbatim(_window(ref_events, 0)),
                           verbatim("no calls at all"),
                           "Loop over driver.replay.mix(driver.completed_samples(timeout)) "
                           "and handle each (worker, batch) it yields.")
        for i in range(max(len(ref_events), len(ans_events))):
            e = ref_events[i] if i < len(ref_events) else None
            a = ans_events[i] if i < len(ans_events) else None
            if not same(e, a):
                raise Mismatch(f"step {step}, call {i + 1} the driver makes in this step",
                               verbatim(_window(ref_events, i)),
                               verbatim(_window(ans_events, i)), _event_hint(e, a))
        if not same(ans["out"], ref["out"]):
            hint = ("Return (sample_timesteps, train_timesteps): the env steps of the new "
                    "batches of this step (not replays), and the env steps the learner trained "
                    "on since the last step: driver.learner.drain_trained(), once, at the "
                    "end.")
            raise Mismatch(f"step {step}: what driver_step returns", ref["out"], ans["out"],
                           hint)
        if not same(ans["state"], ref["state"]):
            raise Mismatch(f"step {step}: the driver's state after the step", ref["state"],
                           ans["state"],
                           "Keep driver.batch_buffer (the batches waiting for a train batch) "
                           "and driver.batch_buffer_steps (their env steps; the dashboard "
                           "reads it) in step, and add 1 to driver.num_sent per answered "
                           "batch.")


def _case(name: str, widths: tuple[int, ...], T: int, train: int, interval: int, rp: float,
          slots: int, steps: int, seed: int, hint: str) -> Case:
    desc = (f"{name}: workers of widths {list(widths)}, T={T}, train_batch_size={train}, "
            f"broadcast_interval={interval}, replay_proportion={rp}, 2 requests in flight "
            f"per worker, {steps} steps (seed {seed})")
    return Case(desc, hint, _params(widths, T, train, interval, rp, slots, seed, steps))


def draw(rng: random.Random) -> Case:
    """A case drawn at random (the grader's fresh cases)."""
    widths = tuple(rng.randint(1, 3) for _ in range(rng.randint(1, 3)))
    T, train, rp = rng.randint(1, 3), rng.randint(2, 12), rng.choice([0.0, 0.5, 1.0])
    # the replay store must outgrow the threshold ceil(train / T), as ReplayMixer demands
    slots = -(-train // T) + rng.randint(1, 4) if rp else 0
    return _case("drawn", widths, T, train, rng.randint(1, 3), rp, slots, rng.randint(4, 10),
                 rng.randrange(10**6), "A case drawn at random: it catches a slip in the "
                 "order of the calls that the fixed cases miss; follow RLlib's loop.")


SPEC = Spec("driver_step", lambda: [_case(*row) for row in _CASES], _steps,
            _reference_trace, _compare,
            lambda: [DriverLoop.step, *loaded("impala_lab.driver.impala", "Impala.step")],
            {"DriverLoop": "the library's DriverLoop.step", "Impala": "the library's Impala",
             ".step": "the library's DriverLoop.step"}, draw)


def check_driver_step(answer: Any, *, show: bool = True) -> CheckResult:
    """Checks ``driver_step(driver, timeout)`` (it gets a `StepDriver`, or a real run's
    ``loop``) against `impala_lab.driver.driver_loop.DriverLoop.step`."""
    return run_check(SPEC, answer, show=show)
