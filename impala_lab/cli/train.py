"""``impala-lab train``: train a run with the CLI's limits and write its outputs as it goes
(`impala_lab.cli.run_folder.RunFolder`): ``config.json`` and ``run.json`` at the start, a
``metrics.csv`` row and ``result.json`` at every report, ``checkpoint/`` every
``--checkpoint-every`` seconds, and at the end ``report.png`` and ``policy.gif`` too.
docs/training.md says what each file holds; docs/reliability.md how each ending goes.
"""
from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from impala_lab.cli.endings import EndingSignals, Output, say
from impala_lab.cli.progress import ProgressView, StopGoal, TargetWatch, final_line, where
from impala_lab.cli.run_folder import FolderLost, RunFolder, read_json
from impala_lab.cli.supervise import should_supervise, supervise
from impala_lab.config import ImpalaConfig
from impala_lab.errors import ConfigError, ImpalaError
from impala_lab.health_flags import describe_seen

if TYPE_CHECKING:  # pragma: no cover
    from impala_lab.driver.impala import Impala

#: The run's limits and output flags with their defaults: stored in run.json, kept on a
#: plain ``--resume`` (a flag given with it replaces the stored one).
RUN_FLAGS: dict[str, Any] = {"stop_return": None, "stop_on": "train", "max_seconds": None,
                             "max_env_steps": None, "train_after_target": 0.0,
                             "checkpoint_every": 60.0, "report_interval": 1.0,
                             "tensorboard": False}
DEFAULT_OUT = "runs/latest"


def check_run_args(args: argparse.Namespace, config: ImpalaConfig) -> None:
    """The train options that are not config fields: limits, report interval, target (and
    ``--stop-on eval`` needs a config whose evaluations it can watch)."""
    for name in ("max_seconds", "report_interval"):
        value = getattr(args, name)
        if value is not None and not (value > 0 and math.isfinite(value)):
            raise ConfigError(f"--{name.replace('_', '-')}={value!r} is invalid: it must be a "
                              "positive number of seconds")
    if args.max_env_steps is not None and args.max_env_steps < 1:
        raise ConfigError(f"--max-env-steps={args.max_env_steps!r} is invalid: it must be >= 1")
    if args.stop_return is not None and not math.isfinite(args.stop_return):
        raise ConfigError(f"--stop-return={args.stop_return!r} is invalid: it must be finite")
    for name, note in (("checkpoint_every", " (0 saves only at the end)"),
                       ("train_after_target", "")):
        value = getattr(args, name)
        if not (value >= 0 and math.isfinite(value)):
            raise ConfigError(f"--{name.replace('_', '-')}={value!r} is invalid: it must be a "
                              f"number of seconds >= 0{note}")
    if args.stop_on not in ("train", "eval"):
        raise ConfigError(f"--stop-on={args.stop_on!r} is invalid: choose 'train' or 'eval'")
    if args.stop_on == "eval" and args.stop_return is None:
        raise ConfigError("--stop-on=eval is invalid without --stop-return: it says which "
                          "return --stop-return watches; add --stop-return RETURN")
    if args.train_after_target > 0 and args.stop_return is None:
        raise ConfigError(f"--train-after-target={args.train_after_target!r} is invalid "
                          "without --stop-return: it counts from the moment the target is "
                          "reached; add --stop-return RETURN")
    if args.stop_on == "eval" and not config.evaluation_interval:
        raise ConfigError(
            f"--stop-on=eval is invalid with evaluation_interval="
            f"{config.evaluation_interval!r}: no evaluation would ever run; add "
            f"--evaluation-interval N (reports between evaluations), or --stop-on train")


def train_command(args: argparse.Namespace, config: ImpalaConfig) -> int:
    """``impala-lab train``: train ``config`` (with ``--resume`` the checkpoint's, with the
    overrides given) until a limit; the exit code: 0, 1 (an error, no sample at all, or
    outputs that could not be written), or 128 + the signal that ended it."""
    resume, out = _folder_arg(args, "resume"), _folder_arg(args, "out")
    given = {k: getattr(args, k) for k in RUN_FLAGS if getattr(args, k, None) is not None}
    state, argv = None, args.argv
    if resume is not None:
        for flag, name in (("--out", "out"), ("--overwrite", "overwrite")):
            if getattr(args, name):
                raise ConfigError(f"{flag} cannot go with --resume: a resumed run writes into "
                                  f"its own folder ({resume}); drop {flag}")
        from impala_lab.driver.checkpoint import restored_config

        root, state = _checkpoint_state(resume)
        stored = read_json(resume / "run.json") or {}
        given = {**{k: v for k, v in stored.items() if _a_flag(k, v)}, **given}
        try:
            config = restored_config(root, state, resume_overrides(args))
        except TypeError as exc:  # a config field of another type in an edited state.json
            raise ConfigError(f"--resume={str(resume)!r}: {root / 'state.json'} holds an "
                              f"invalid config ({exc})") from None
        out, argv = resume, stored.get("argv")
    flags = {**RUN_FLAGS, **given}
    vars(args).update(flags, out=out or Path(DEFAULT_OUT))
    check_run_args(args, config)
    if state is not None:
        _check_left(args, resume, state["counters"])
    if should_supervise(config.backend):
        return supervise(args.argv, args.out)
    folder = RunFolder(args.out, overwrite=args.overwrite, resume=resume is not None)
    folder.write_first({"config.json": config.to_dict(), "run.json": {**flags, "argv": argv}})
    try:
        return _run_in(folder, args, config, state)
    finally:
        folder.close()


def _a_flag(name: str, value: Any) -> bool:
    """A run.json entry that can stand for a flag (an edited file's other values are left
    out: the defaults stand)."""
    if name not in RUN_FLAGS:
        return False
    default = RUN_FLAGS[name]
    if value is None or isinstance(default, bool | str):
        return value is default or type(value) is type(default)
    return isinstance(value, int | float) and not isinstance(value, bool)


def _folder_arg(args: argparse.Namespace, name: str) -> Path | None:
    value = getattr(args, name)
    if value is not None and not str(value).strip():
        raise ConfigError(f"--{name}={str(value)!r} is invalid: give a folder for this run's "
                          "files, e.g. --out runs/cartpole")
    return None if value is None else Path(value)


def _checkpoint_state(resume: Path) -> tuple[Path, dict[str, Any]]:
    """The checkpoint a resume reads (``checkpoint``, or ``checkpoint.prev`` that a save
    killed between its renames left) and its state.json."""
    for root in (resume / "checkpoint", resume / "checkpoint.prev"):
        state = read_json(root / "state.json")
        if state is not None and all(isinstance(state.get(k), dict)
                                     for k in ("config", "counters")):
            return root, state
    raise ConfigError(f"--resume={str(resume)!r} is invalid: there is no checkpoint to resume "
                      f"from ({resume / 'checkpoint' / 'state.json'} is missing); give the "
                      "--out folder of an earlier impala-lab train")


def _check_left(args: argparse.Namespace, resume: Path, counters: dict[str, Any]) -> None:
    """A resumed run must have some of its limits left."""
    for flag, limit, done, unit in (
            ("--max-seconds", args.max_seconds, _number(counters.get("elapsed_s")), "s"),
            ("--max-env-steps", args.max_env_steps,
             _number(counters.get("num_steps_sampled")), "env steps")):
        if limit is not None and done >= limit:
            raise ConfigError(f"--resume={str(resume)!r}: the run has done {done:,.0f} {unit} "
                              f"of its {flag} {limit:g}, so nothing is left to train: give a "
                              f"larger {flag} to continue it")


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) else 0.0


def resume_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The config fields given on the command line, parsed: ``config_from_args``'s values,
    and with ``--resume`` what replaces the run's."""
    from impala_lab.config import field_kind, field_names
    from impala_lab.config_checks import parse_text

    return {name: parse_text(name, field_kind(name), getattr(args, name))
            for name in field_names() if getattr(args, name, None) is not None}


def _run_in(folder: RunFolder, args: argparse.Namespace, config: ImpalaConfig,
            state: dict[str, Any] | None) -> int:
    out = folder.out
    ending = EndingSignals()
    from impala_lab.driver.impala import Impala

    impala: Impala | None = None
    try:
        impala = _restore(Impala, out, args) if state is not None else Impala(config)
        watch, limit = TargetWatch(args), args.max_seconds
        if state is not None:
            config = impala.config
            before = _number(state["counters"].get("elapsed_s"))
            try:
                watch.resume(folder.cut_metrics(impala.num_steps_sampled), before)
            except (OSError, FolderLost) as exc:
                raise ConfigError(f"--resume={str(out)!r}: its metrics.csv cannot be cut back "
                                  f"to the checkpoint ({exc}); nothing was trained") from None
            limit = None if limit is None else limit - before
        result, error = _train_and_save(impala, config, args, folder, watch, limit, ending)
    except KeyboardInterrupt:  # while TensorFlow loads, workers start or training begins
        ending.restore()  # a second signal now ends the process as it would without us
        so_far = (f"only {out}/config.json was written" if impala is None else
                  f"the outputs so far are in {out}/")
        say(f"impala-lab: interrupted before training started; {so_far}", err=True)
        return ending.exit_code(True)
    finally:
        if impala is not None:
            impala.stop()
        ending.restore()
    interrupted = result["stop_reason"] == "interrupted"
    if error is not None:
        # The error's own text names the stage, the env and the worker's traceback; the
        # driver's stack under it would only bury that.
        say(f"impala-lab: error: {type(error).__name__}: {error}", err=True)
        seen = describe_seen(result["health"])
        saw = f"; health monitor saw: {seen}" if seen else ""
        written = (f"nothing more was written into {out}/" if folder.lost else
                   where(out, folder.unwritten) if folder.unwritten else
                   f"metrics, result and checkpoint are in {out}/")
        say(f"impala-lab: the run stopped{saw}; {written}", err=True)
        return 1
    say(final_line(result, args, out, interrupted, folder.unwritten))
    code = ending.exit_code(interrupted)
    return code if interrupted else 1 if folder.unwritten else code or 0


def _restore(impala_class: Any, resume: Path, args: argparse.Namespace) -> Impala:
    """The run of ``--resume DIR``; a damaged checkpoint is a one-line `ConfigError`."""
    try:
        return impala_class.restore(resume / "checkpoint", fallback_to_prev=True,
                                    **resume_overrides(args))
    except ConfigError:
        raise
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--resume={str(resume)!r}: the checkpoint cannot be read ({exc})"
                          ) from None


def _history_row(s: dict[str, Any]) -> dict[str, Any]:
    from impala_lab.driver.run_stats import history_row

    return history_row({k: v for k, v in s.items() if k != "stop_reason"})


def metrics_row(s: dict[str, Any]) -> dict[str, Any]:
    """A stats snapshot as a metrics.csv row (the history's row, stamped with the time)."""
    return {**_history_row(s), "time": time.time()}


def _train_and_save(impala: Impala, config: ImpalaConfig, args: argparse.Namespace,
                    folder: RunFolder, watch: TargetWatch, limit: float | None,
                    ending: EndingSignals) -> tuple[dict[str, Any], ImpalaError | None]:
    """Train for at most ``limit`` seconds, writing the outputs as it goes and at the end;
    returns ``result.json``'s dict and the error that ended the run (None if none did)."""
    view = ProgressView(StopGoal(args.stop_return, args.max_env_steps, limit),
                        title=f"{config.env_id} ({config.backend}, {config.num_workers} workers)")
    output = Output(not args.quiet)
    last_save = [time.monotonic()]

    def on_report(s: dict) -> None:
        watch.on_report(s)
        output(view.update, s)
        folder.append_metrics([metrics_row(s)])
        running = {**s, "stop_reason": "running"}
        folder.write_json("result.json", _result(watch, args, running, None, time.monotonic()))
        broken = impala.evaluator.broken if impala.evaluator.enabled else None
        if broken and watch.stop_on == "eval":
            raise ImpalaError(f"--stop-on eval cannot stop this run: its evaluations fail "
                              f"({broken}); fix the env's evaluation, or stop on the actors' "
                              "return (--stop-on train)")
        if args.checkpoint_every and time.monotonic() - last_save[0] >= args.checkpoint_every:
            last_save[0] = time.monotonic()
            _save_checkpoint(impala, folder)

    started = time.monotonic()
    final, error = _train(impala, args, watch, view, on_report, limit)
    rows = [metrics_row(final)]  # and a row of the final evaluation, if it is played
    final_evaluation = None
    try:
        if error is None and final["stop_reason"] != "interrupted" and impala.evaluator.enabled:
            left = None if limit is None else limit - (time.monotonic() - started)
            final, error, final_evaluation = _final_evaluation(impala, final, left)
            rows += [metrics_row(final)] * (final_evaluation == "done")
    except KeyboardInterrupt:  # a signal during the final evaluation
        final = {**final, "stop_reason": "interrupted"}
    ending.defer()  # a signal from here on waits for the outputs
    watch.note_best(final)  # a run shorter than one report interval has only its final stats
    ended = time.monotonic()
    output(view.close)
    impala.stop()
    result = {**_result(watch, args, final, error, ended), "final_evaluation": final_evaluation}
    lost = _save_outputs(impala, config, folder, result, rows)
    return result, error or lost


def _save_checkpoint(impala: Impala, folder: RunFolder) -> None:
    folder.check()
    try:
        impala.save(folder.out / "checkpoint")
    except Exception as exc:  # e.g. a full disk: the metrics and result still count
        if "checkpoint" not in folder.unwritten:
            say(f"impala-lab: could not save the checkpoint: {exc}", err=True)
        folder.unwritten["checkpoint"] = str(getattr(exc, "strerror", None) or exc)
    else:
        folder.unwritten.pop("checkpoint", None)


def _train(impala: Impala, args: argparse.Namespace, watch: TargetWatch, view: ProgressView,
           on_report: Callable[[dict], None], limit: float | None
           ) -> tuple[dict[str, Any], ImpalaError | None]:
    """``impala.train`` with the CLI's limits; returns the final stats (``stop_reason``
    "interrupted" or "error" after an interrupt or a run-time error) and the error that ended
    the run, which a run that got no sample at all has too."""
    sampled_before = impala.num_steps_sampled
    error: ImpalaError | None = None
    view.begin()
    try:
        final = impala.train(watch.stop if args.stop_return is not None else None,
                             max_seconds=limit, max_env_steps=args.max_env_steps,
                             report_interval=args.report_interval, on_report=on_report,
                             tensorboard_dir=args.out / "tensorboard" if args.tensorboard else None)
    except KeyboardInterrupt:
        final = {**impala.record(), "stop_reason": "interrupted"}
    except ImpalaError as exc:  # a worker, learner or loss error: results still written
        error = exc
        final = {**impala.record(), "stop_reason": "error"}
    if final["stop_reason"] not in ("error", "interrupted") and (
            final["num_steps_sampled"] == sampled_before):
        error = ImpalaError(
            f"no samples: no worker returned a sample in the whole run "
            f"({final['time_total_s']:.1f} s, stop: {final['stop_reason']}); the env may "
            f"hang in reset() or step() (sample_timeout_s={impala.config.sample_timeout_s} "
            f"ends a worker that owes a sample that long), or the workers cannot start")
        impala.last_error = final["last_error"] = f"ImpalaError: {error}"
    return final, error


def _final_evaluation(impala: Impala, final: dict[str, Any], seconds_left: float | None
                      ) -> tuple[dict[str, Any], ImpalaError | None, str]:
    """(final stats, error, what became of it) of the final weights evaluated once more
    within ``seconds_left`` (None: the evaluator's deadline); with no time left the latest
    evaluation stands."""
    if seconds_left is not None and seconds_left <= 0:
        failed = impala.evaluator.error
        return (final, ImpalaError(f"evaluation failed: {failed}") if failed else None,
                "skipped: --max-seconds was reached")
    try:
        evaluation = impala.evaluator.evaluate(timeout_s=seconds_left)
    except ImpalaError as exc:
        return {**final, "evaluation": impala.evaluator.latest()}, exc, "failed"
    final = {**final, "evaluation": evaluation}
    impala.history.append(_history_row(final))
    return final, None, "done"


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
                  result: dict[str, Any], rows: list[dict[str, Any]]) -> FolderLost | None:
    """The last rows, checkpoint, ``policy.gif`` and ``report.png``, then ``result.json``
    naming those that could not be written; returns the `FolderLost` that stopped them."""
    try:
        folder.append_metrics(rows)
        _save_checkpoint(impala, folder)
        _save_policy_gif(impala, config, folder)
        try:
            from impala_lab.dashboard.plots import save_report

            title = f"{config.env_id} ({config.backend}, {config.num_workers} workers)"
            rows = impala.history.rows()
            folder.write_file("report.png", lambda path: save_report(rows, path, title=title))
        except FolderLost:
            raise
        except Exception as exc:  # a plot must never cost the run's results
            say(f"impala-lab: could not draw report.png: {exc}", err=True)
        result["unwritten"] = dict(folder.unwritten)
        folder.write_json("result.json", result)
    except FolderLost as exc:
        return exc
    return None


def _save_policy_gif(impala: Impala, config: ImpalaConfig, folder: RunFolder) -> None:
    """One episode of the final policy (at most 300 frames) as ``policy.gif``; an env that
    cannot render (a factory, CartPole without pygame) writes none."""
    if not isinstance(config.env, str):
        return
    from impala_lab.cli import play

    # MuJoCo's frames are drawn in a process of their own, never beside TensorFlow
    draw = play.gif_in_child if play.renders_with_opengl(config.env) else play.policy_gif
    try:
        weights, _ = impala.policy.get_weights()
        folder.write_file("policy.gif", lambda path: draw(config, weights, path, max_frames=300,
                                                          seed=config.seed))
    except FolderLost:
        raise
    except Exception as exc:  # a GIF must never cost the run's results
        say(f"impala-lab: no policy.gif: {exc}", err=True)
