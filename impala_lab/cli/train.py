"""``impala-lab train``: train a run with the CLI's limits and write its outputs as it goes.

The output folder (`impala_lab.cli.run_folder.RunFolder`: one run per folder, locked) holds
``config.json`` from the start; ``metrics.csv`` gains a row and ``result.json`` (the state so
far: ``stop_reason`` "running") is replaced at every report; ``checkpoint/`` is saved every
``--checkpoint-every`` seconds. At the end ``result.json`` says solved, seconds_to_target,
env_steps_to_target, the health monitor's findings and the final stats, and ``report.png``,
``policy.gif`` (one episode of the final policy, at most 300 frames, when the env renders
``rgb_array``) and the last checkpoint are written (with ``--tensorboard`` also
``tensorboard/``, at every report). The last line says whether the target was reached, where
the results are and, if not, what the health monitor saw.

Endings: Ctrl-C, SIGTERM or SIGHUP end the run within seconds and still write all of them
(exit code 128 + the signal: 130, 143, 129); so does an error of a worker, the learner or the
loss (exit code 1, the error in ``result.json`` and on stderr), and a run in which no worker
returned a single sample (e.g. every env hangs) until ``--max-seconds``: that is a failed run,
not a finished one (exit code 1, ``error`` names it, ``stop_reason`` stays ``max_seconds``). A
closed stdout (``| head``) stops the progress view, not the run. A SIGKILL leaves the metrics,
the last ``result.json`` and the last checkpoint: ``--resume OUT`` continues from there.

``--train-after-target SECONDS`` keeps training that long after ``--stop-return`` is reached
(does the run stay solved?); ``--max-seconds`` stays the cap of the whole run, so give it room
for both phases (e.g. ``--max-seconds 120 --train-after-target 60``).
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from impala_lab.cli.progress import ProgressView, StopGoal, final_line
from impala_lab.cli.run_folder import RunFolder
from impala_lab.cli.supervise import should_supervise, supervise
from impala_lab.config import ImpalaConfig
from impala_lab.driver.health import RETURN_MIN_EPISODES
from impala_lab.errors import ConfigError, ImpalaError
from impala_lab.health_flags import describe_seen
from impala_lab.stats import process_start

if TYPE_CHECKING:  # pragma: no cover
    from impala_lab.driver.impala import Impala


def check_run_args(args: argparse.Namespace) -> None:
    """The train options that are not config fields: limits, report interval, target."""
    for name in ("max_seconds", "report_interval"):
        value = getattr(args, name)
        if value is not None and not (value > 0 and math.isfinite(value)):
            raise ConfigError(f"--{name.replace('_', '-')}={value!r} is invalid: it must be a "
                              "positive number of seconds")
    if args.max_env_steps is not None and args.max_env_steps < 1:
        raise ConfigError(f"--max-env-steps={args.max_env_steps!r} is invalid: it must be >= 1")
    if args.stop_return is not None and not math.isfinite(args.stop_return):
        raise ConfigError(f"--stop-return={args.stop_return!r} is invalid: it must be finite")
    every = getattr(args, "checkpoint_every", 0.0)
    if not (every >= 0 and math.isfinite(every)):
        raise ConfigError(f"--checkpoint-every={every!r} is invalid: it must be a number of "
                          "seconds >= 0 (0 saves only at the end)")
    after = args.train_after_target
    if not (after >= 0 and math.isfinite(after)):
        raise ConfigError(f"--train-after-target={after!r} is invalid: it must be a number of "
                          "seconds >= 0")
    if getattr(args, "stop_on", "train") == "eval" and args.stop_return is None:
        raise ConfigError("--stop-on=eval is invalid without --stop-return: it says which "
                          "return --stop-return watches; add --stop-return RETURN")
    if after > 0 and args.stop_return is None:
        raise ConfigError(f"--train-after-target={after!r} is invalid without --stop-return: "
                          "it counts from the moment the target is reached; add "
                          "--stop-return RETURN")


def check_stop_on(args: argparse.Namespace, config: ImpalaConfig) -> None:
    """``--stop-on eval`` needs evaluations to watch: a config with evaluation_interval."""
    if getattr(args, "stop_on", "train") == "eval" and not config.evaluation_interval:
        raise ConfigError(
            f"--stop-on=eval is invalid with evaluation_interval="
            f"{config.evaluation_interval!r}: no evaluation would ever run; add "
            f"--evaluation-interval N (reports between evaluations), or --stop-on train")


def evaluation_return(s: dict) -> float:
    """The return an evaluation reported: the greedy policy's where it was played, else
    the sampled one's; NaN before the first evaluation (or with evaluation off)."""
    ev = s.get("evaluation") or {}
    if not ev.get("num_evaluations"):
        return math.nan
    greedy = ev.get("episode_return_mean_greedy", math.nan)
    return greedy if math.isfinite(greedy) else ev.get("episode_return_mean_sampled", math.nan)


class TargetWatch:
    """Watches the reports for ``--stop-return``: when it was first reached (seconds from
    process start, env steps, and on the monotonic clock), the mean returns reported from then
    on, and the best trailing mean of the whole run."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.stop_return: float | None = args.stop_return
        self.stop_on: str = getattr(args, "stop_on", "train")
        self.train_after_target: float = args.train_after_target
        self.seconds: float | None = None
        self.env_steps: int | None = None
        self.at: float | None = None
        self.returns_after: list[float] = []
        self.best_return_mean: float | None = None

    @property
    def reached(self) -> bool:
        return self.at is not None

    def watched_return(self, s: dict) -> float:
        """The return ``--stop-return`` watches: the actors' trailing mean (``--stop-on
        train``, once 100 episodes finished) or the latest evaluation's (``eval``)."""
        if self.stop_on == "eval":
            return evaluation_return(s)
        return s["episode_return_mean"] if s["episode_return_count"] >= 100 else math.nan

    def solved(self, s: dict) -> bool:
        ret = self.watched_return(s)
        return self.stop_return is not None and math.isfinite(ret) and ret >= self.stop_return

    def note_best(self, s: dict) -> None:
        ret = s["episode_return_mean"]
        if s["episode_return_count"] >= RETURN_MIN_EPISODES and math.isfinite(ret):
            self.best_return_mean = max(ret, self.best_return_mean or -math.inf)

    def note_target(self, s: dict) -> None:
        """The first time ``s`` meets the target: when, and after how many env steps."""
        if self.at is None and self.solved(s):
            self.at = time.monotonic()
            self.seconds = round(self.at - process_start(), 2)
            self.env_steps = s["num_steps_sampled"]

    def on_report(self, s: dict) -> None:
        """Each report (a row of metrics.csv): the best mean, the target, and from the
        target on, the return it watched (``return_min_after_target`` is their lowest)."""
        self.note_best(s)
        self.note_target(s)
        if self.at is not None:
            self.returns_after.append(self.watched_return(s))

    def stop(self, s: dict) -> bool:
        """Reached, and trained ``--train-after-target`` seconds since. `Impala.train` calls
        it between reports too, so the target is noted when it is met, not at the next
        report."""
        self.note_target(s)
        return self.at is not None and time.monotonic() - self.at >= self.train_after_target


def train_command(args: argparse.Namespace, config: ImpalaConfig) -> int:
    """``impala-lab train``: train ``config`` (built from ``args`` by
    `impala_lab.cli.main.config_from_args`; with ``--resume`` the checkpoint's) until a limit,
    writing the outputs as it goes; the exit code: 0, 1 (an error, or no sample at all), or
    128 + the signal that ended it (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP)."""
    check_run_args(args)
    for name in ("out", "resume"):
        value = getattr(args, name, None)
        if value is not None and not str(value).strip():
            raise ConfigError(f"--{name}={str(value)!r} is invalid: give a folder for this "
                              "run's files, e.g. --out runs/cartpole")
        if value is not None:
            setattr(args, name, Path(value))
    check_stop_on(args, config)
    resume: Path | None = getattr(args, "resume", None)
    if resume is not None and not (resume / "checkpoint" / "state.json").is_file():
        raise ConfigError(f"--resume={str(resume)!r} is invalid: there is no checkpoint to resume "
                          f"from ({resume / 'checkpoint' / 'state.json'} is missing); give the "
                          "--out folder of an earlier impala-lab train")
    out: Path = resume if resume is not None else args.out
    args.out = out  # a resumed run writes (TensorBoard too) where it was
    if should_supervise(config.backend) and getattr(args, "argv", None) is not None:
        return supervise(args.argv, out)
    folder = RunFolder(out, overwrite=getattr(args, "overwrite", False),
                       resume=resume is not None)
    try:
        return _run_in(folder, args, config, resume)
    finally:
        folder.close()


def _run_in(folder: RunFolder, args: argparse.Namespace, config: ImpalaConfig,
            resume: Path | None) -> int:
    out = folder.out
    if resume is None:
        folder.write_json("config.json", config.to_dict())
    ending = _EndingSignals()
    from impala_lab.driver.impala import Impala

    try:
        if resume is not None:
            impala = _restore(Impala, resume, args)
            config = impala.config
        else:
            impala = Impala(config)
    except KeyboardInterrupt:  # Ctrl-C while TensorFlow loads or workers start
        ending.restore()
        _say(f"impala-lab: interrupted before training started; only {out}/config.json "
             "was written", err=True)
        return ending.exit_code()
    except BaseException:  # a config error found while building: the handlers go back
        ending.restore()
        raise
    try:
        result, error = _train_and_save(impala, config, args, folder)
    finally:
        impala.stop()
        ending.restore()
    if error is not None:
        # The error's own text names the stage, the env and the worker's traceback; the
        # driver's stack under it would only bury that.
        _say(f"impala-lab: error: {type(error).__name__}: {error}", err=True)
        seen = describe_seen(result["health"])
        saw = f"; health monitor saw: {seen}" if seen else ""
        _say(f"impala-lab: the run stopped{saw}; metrics, result and checkpoint are in {out}/",
             err=True)
        return 1
    interrupted = result["stop_reason"] == "interrupted"
    _say(final_line(result, args, out, interrupted))
    return ending.exit_code() if interrupted else 0


def _restore(impala_class: Any, resume: Path, args: argparse.Namespace) -> Impala:
    """The run of ``--resume DIR``; a damaged checkpoint is a one-line `ConfigError`."""
    try:
        return impala_class.restore(resume / "checkpoint", fallback_to_prev=True,
                                    **resume_overrides(args))
    except (OSError, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"--resume={str(resume)!r}: the checkpoint cannot be read ({exc})"
                          ) from None


def resume_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The config fields given on the command line of ``--resume``: they replace the run's."""
    from impala_lab.config import field_kind, field_names
    from impala_lab.config_checks import parse_text

    return {name: parse_text(name, field_kind(name), getattr(args, name))
            for name in field_names() if getattr(args, name, None) is not None}


class _EndingSignals:
    """SIGTERM and SIGHUP end the run as Ctrl-C does (outputs written); the exit code then
    says which signal it was (128 + its number)."""

    SIGNALS = tuple(s for s in (signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s)

    def __init__(self) -> None:
        self.signum = signal.SIGINT
        self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}

    def _handle(self, signum: int, frame: Any) -> None:
        self.signum = signum
        raise KeyboardInterrupt

    def exit_code(self) -> int:
        return 128 + int(self.signum)

    def restore(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)


def _say(text: str, err: bool = False) -> None:
    """Prints a line; a closed stdout (``impala-lab train ... | head``) costs nothing."""
    stream = sys.stderr if err else sys.stdout
    try:
        print(text, file=stream, flush=True)
    except BrokenPipeError:
        _silence(stream)


def _silence(stream: Any) -> None:
    """Points a stream whose reader is gone at /dev/null, so that later writes (and Python's
    flush at exit) do not raise again."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)


def _train_and_save(impala: Impala, config: ImpalaConfig, args: argparse.Namespace,
                    folder: RunFolder) -> tuple[dict[str, Any], ImpalaError | None]:
    """Train until a limit, an interrupt or an error, writing metrics, result and checkpoints
    as it goes, then every output; returns ``result.json``'s dict and the error that ended
    the run (None if none did)."""
    watch = TargetWatch(args)
    # A terminal gets a progress bar over the live panel, redrawn in place; a log gets one
    # progress line per report.
    view = ProgressView(StopGoal(args.stop_return, args.max_env_steps, args.max_seconds),
                        title=f"{config.env_id} ({config.backend}, {config.num_workers} workers)")
    shown = [not args.quiet]
    every = getattr(args, "checkpoint_every", None)
    last_save = [time.monotonic()]

    def on_report(s: dict) -> None:
        watch.on_report(s)
        if shown[0]:
            try:
                view.update(s)
            except BrokenPipeError:  # the reader of stdout is gone: the run goes on
                shown[0] = False
                _silence(sys.stdout)
        folder.append_metrics(impala.history.rows())
        running = {**s, "stop_reason": "running"}
        folder.write_json("result.json", _result(watch, args, running, None, time.monotonic()))
        if every and time.monotonic() - last_save[0] >= every:
            last_save[0] = time.monotonic()
            _save_checkpoint(impala, folder.out)

    final, error = _train(impala, args, watch, view, on_report)
    if error is None and impala.evaluator.enabled:
        final = _final_evaluation(impala, final)
    watch.note_best(final)  # a run shorter than one report interval has only its final stats
    ended = time.monotonic()
    with contextlib.suppress(BrokenPipeError):
        view.close()
    impala.stop()
    result = _result(watch, args, final, error, ended)
    _save_outputs(impala, config, folder, result)
    return result, error


def _save_checkpoint(impala: Impala, out: Path) -> None:
    try:
        impala.save(out / "checkpoint")
    except Exception as exc:  # e.g. a full disk: the metrics and result still count
        _say(f"impala-lab: could not save the checkpoint: {exc}", err=True)


def _train(impala: Impala, args: argparse.Namespace, watch: TargetWatch, view: ProgressView,
           on_report: Callable[[dict], None]) -> tuple[dict[str, Any], ImpalaError | None]:
    """``impala.train`` with the CLI's limits; returns the final stats and the error that
    ended the run: an interrupt or a run-time error ends it with the last stats
    (``stop_reason`` "interrupted" or "error"), and a run that got no sample at all is an
    error too (its ``stop_reason`` stays the limit it reached)."""
    sampled_before = impala.num_steps_sampled
    error: ImpalaError | None = None
    view.begin()
    try:
        final = impala.train(watch.stop if args.stop_return is not None else None,
                             max_seconds=args.max_seconds, max_env_steps=args.max_env_steps,
                             report_interval=args.report_interval, on_report=on_report,
                             tensorboard_dir=args.out / "tensorboard" if args.tensorboard else None)
    except KeyboardInterrupt:
        final = impala.record()
        final["stop_reason"] = "interrupted"
    except ImpalaError as exc:  # a worker, learner or loss error: results still written
        error = exc
        final = impala.record()
        final["stop_reason"] = "error"
    if final["stop_reason"] not in ("error", "interrupted") and (
            final["num_steps_sampled"] == sampled_before):
        error = ImpalaError(
            f"no samples: no worker returned a sample in the whole run "
            f"({final['time_total_s']:.1f} s, stop: {final['stop_reason']}); the env may "
            f"hang in reset() or step() (sample_timeout_s={impala.config.sample_timeout_s} "
            f"ends a worker that owes a sample that long), or the workers cannot start")
        impala.last_error = final["last_error"] = f"ImpalaError: {error}"
    return final, error


def _final_evaluation(impala: Impala, final: dict[str, Any]) -> dict[str, Any]:
    """The final weights evaluated once more, into the final stats and a last metrics.csv
    row; an evaluation that fails is said on stderr and leaves the stats as they were."""
    from impala_lab.driver.run_stats import history_row

    try:
        evaluation = impala.evaluator.evaluate()
    except ImpalaError as exc:
        print(f"impala-lab: the final evaluation failed: {exc}", file=sys.stderr)
        return final
    final = {**final, "evaluation": evaluation}
    impala.history.append(history_row({k: v for k, v in final.items() if k != "stop_reason"}))
    return final


def _result(watch: TargetWatch, args: argparse.Namespace, final: dict[str, Any],
            error: ImpalaError | None, ended: float) -> dict[str, Any]:
    """``result.json``: was the target reached, when, how the run did after it, and why it
    stopped; ``ended`` is when training ended, on the monotonic clock."""
    returns_after = list(watch.returns_after)
    if watch.reached:
        returns_after.append(watch.watched_return(final))
    finite_after = [r for r in returns_after if math.isfinite(r)]
    return {"solved": watch.reached,
            "stop_return": args.stop_return,
            "stop_on": watch.stop_on,
            "seconds_to_target": watch.seconds,
            "env_steps_to_target": watch.env_steps,
            "train_after_target": args.train_after_target,
            "seconds_after_target": round(ended - watch.at, 2) if watch.reached else None,
            "return_min_after_target": min(finite_after) if finite_after else None,
            "best_return_mean": watch.best_return_mean,
            "stop_reason": final.get("stop_reason"),
            "error": None if error is None else f"{type(error).__name__}: {error}",
            "health": final.get("health"),
            "final": final}


def _save_outputs(impala: Impala, config: ImpalaConfig, folder: RunFolder,
                  result: dict[str, Any]) -> None:
    """The checkpoint, ``metrics.csv``, ``result.json`` and ``report.png``; each that cannot be
    written is reported on stderr and costs nothing else."""
    out = folder.out
    _save_checkpoint(impala, out)
    folder.append_metrics(impala.history.rows())
    folder.write_json("result.json", result)
    _save_policy_gif(impala, config, out / "policy.gif")
    try:
        from impala_lab.dashboard.plots import save_report

        save_report(impala.history.rows(), out / "report.png",
                    title=f"{config.env_id} ({config.backend}, {config.num_workers} workers)")
    except Exception as exc:  # a plot must never cost the run's results
        _say(f"impala-lab: could not draw report.png: {exc}", err=True)


def _save_policy_gif(impala: Impala, config: ImpalaConfig, path: Path) -> None:
    """One episode of the final policy (at most 300 frames) as ``path``, when the env renders
    rgb_array frames; the numpy policy plays it, so it costs a MinAtar run well under a
    second. MuJoCo's envs are drawn in a process of their own (`play.gif_in_child`). An env
    that cannot render (a factory, CartPole without pygame) writes none."""
    if not isinstance(config.env, str):
        return
    from impala_lab.cli.play import (
        gif_in_child,
        policy_model,
        record_episodes,
        renders_with_opengl,
        write_gif,
    )

    try:
        weights, _ = impala.policy.get_weights()
        if renders_with_opengl(config.env):  # MuJoCo: not beside TensorFlow (see play.py)
            gif_in_child(config, weights, path, max_frames=300, seed=config.seed)
            return
        space, actions = impala.observation_space, impala.action_space
        model = policy_model(config, space, actions)
        model.set_weights(weights)
        frames, _ = record_episodes(config.env, model, episodes=1, max_frames=300,
                                    seed=config.seed, clip=config.clip_actions,
                                    squash=config.squash_actions)
        write_gif(frames, path)
    except Exception as exc:  # a GIF must never cost the run's results
        _say(f"impala-lab: no {path.name}: {exc}", err=True)
