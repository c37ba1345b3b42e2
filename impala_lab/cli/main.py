"""The ``impala-lab`` command.

    impala-lab train --env CartPole-v1 --stop-return 475 --out runs/cartpole
    impala-lab train --num-workers 4 --num-envs-per-worker 8 --lr 0.001
    impala-lab config                      # the config table
    impala-lab play --checkpoint runs/breakout/checkpoint --episodes 3 --out breakout.gif
    impala-lab notebooks my-course         # copy the course's notebooks (--solutions too)

Every `ImpalaConfig` field is an option (``--field-name value``). Bad input exits with code 2
and a message naming the option, the value and the fix, before any process starts.

While it trains, a terminal shows a progress bar towards the nearest limit over the live
panel, and a log one progress line per report (`impala_lab.cli.progress`).

At the end the output directory holds ``config.json``, ``metrics.csv`` (a row per report
interval), ``result.json`` (solved, seconds_to_target, env_steps_to_target, the health
monitor's findings, final stats), ``report.png``, ``policy.gif`` (one episode of the final
policy, at most 300 frames, when the env renders ``rgb_array``), ``checkpoint/`` (and with
``--tensorboard``
``tensorboard/``, written at every report), and the last line says
whether the target was reached, where the results are and, if not, what the health monitor
saw. Ctrl-C or SIGTERM ends the run within seconds and still writes all of them (exit code
130); so does an error of a worker, the learner or the loss (exit code 1, the error in
``result.json`` and on stderr), and a run in which no worker returned a single sample (e.g.
every env hangs) until ``--max-seconds``: that is a failed run, not a finished one (exit
code 1, ``error`` names it, ``stop_reason`` stays ``max_seconds``).

``--train-after-target SECONDS`` keeps training that long after ``--stop-return`` is reached
(does the run stay solved?); ``--max-seconds`` stays the cap of the whole run, so give it room
for both phases (e.g. ``--max-seconds 120 --train-after-target 60``).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from impala_lab.cli.progress import ProgressView, StopGoal
from impala_lab.config import (
    TUNED_PRESETS,
    ImpalaConfig,
    field_help,
    field_kind,
    field_names,
)
from impala_lab.driver.health import RETURN_MIN_EPISODES, describe_seen
from impala_lab.errors import ConfigError, ImpalaError
from impala_lab.stats import jsonable

if TYPE_CHECKING:  # pragma: no cover
    from impala_lab.driver.impala import Impala

# Where the OS cannot say when the process started: this module is imported before TensorFlow.
_IMPORTED_AT = time.monotonic()


def process_start() -> float:
    """When this process started, on the `time.monotonic` clock, so that time-to-solve counts
    the interpreter's and TensorFlow's start-up. Linux says it in /proc/self/stat (clock ticks
    since boot); elsewhere it is when this module was imported."""
    try:
        with open("/proc/self/stat") as fh:
            # after "pid (comm)": the command name may hold spaces
            fields = fh.read().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - started
    except (OSError, IndexError, ValueError, AttributeError):  # no /proc, no CLOCK_BOOTTIME
        return _IMPORTED_AT
    return min(time.monotonic() - age, _IMPORTED_AT)


def _parse_value(name: str, text: str) -> Any:
    kind = field_kind(name)
    base = kind.rstrip("?")
    if kind.endswith("?") and text.lower() in ("none", "null"):
        return None
    try:
        if base == "int":
            return int(text)
        if base == "float":
            return float(text)
        if base == "bool":
            lowered = text.lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError(text)
        if base == "model":
            return tuple(int(x) for x in text.replace(",", " ").split())
        if base == "filters":  # 16x3x1,32x3x1: (filters, kernel, stride) per layer
            layers = tuple(tuple(int(v) for v in layer.split("x"))
                           for layer in text.replace(",", " ").split())
            if not layers or any(len(layer) != 3 for layer in layers):
                raise ValueError(text)
            return layers
    except ValueError:
        expected = {"int": "an integer", "float": "a number", "bool": "true or false",
                    "model": "hidden sizes such as 64,64",
                    "filters": "conv layers FILTERSxKERNELxSTRIDE such as 16x3x1,32x3x1"}[base]
        raise ConfigError(f"--{name.replace('_', '-')}={text!r} is invalid: it must be "
                          f"{expected}") from None
    return text


def build_parser() -> argparse.ArgumentParser:
    """The parser of every subcommand; ``main`` runs ``COMMANDS[args.command]``."""
    parser = argparse.ArgumentParser(prog="impala-lab", description="IMPALA, as RLlib built it, "
                                     "for learning and experiments.")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_train_parser(sub)
    sub.add_parser("config", help="print the config table (markdown)")
    _add_notebooks_parser(sub)
    _add_play_parser(sub)
    return parser


def _add_train_parser(sub: Any) -> None:
    train = sub.add_parser("train", help="train a policy", formatter_class=argparse.
                           ArgumentDefaultsHelpFormatter)
    run = train.add_argument_group("run")
    run.add_argument("--stop-return", type=float, default=None,
                     help="stop once the mean return of the last 100 episodes reaches this")
    run.add_argument("--max-seconds", type=float, default=None,
                     help="wall-clock limit of the whole training (with --train-after-target "
                     "too: leave room for both phases)")
    run.add_argument("--max-env-steps", type=int, default=None, help="env step limit")
    run.add_argument("--train-after-target", type=float, default=0.0, metavar="SECONDS",
                     help="once --stop-return is reached, keep training this many seconds "
                     "more; result.json then says the lowest mean return after the target "
                     "(return_min_after_target)")
    run.add_argument("--out", type=Path, default=Path("runs/latest"), help="output directory")
    run.add_argument("--report-interval", type=float, default=1.0,
                     help="seconds between progress lines and metrics.csv rows")
    run.add_argument("--quiet", action="store_true",
                     help="no progress bar (in a terminal) or progress lines (elsewhere)")
    run.add_argument("--tensorboard", action="store_true",
                     help="write TensorBoard summaries of every report into OUT/tensorboard "
                     "(make tensorboard opens them)")
    run.add_argument("--preset", choices=("tuned", "rllib"), default="tuned",
                     help="defaults for fields you do not set: 'tuned' uses the values tuned "
                     "for the env where there are some (CartPole-v1), 'rllib' RLlib's defaults")
    cfg = train.add_argument_group("config (every ImpalaConfig field)")
    defaults = ImpalaConfig.__dataclass_fields__
    for name in field_names():
        default = defaults[name].default
        extra = {"nargs": "?", "const": "true"} if field_kind(name) == "bool" else {}
        cfg.add_argument("--" + name.replace("_", "-"), dest=name, default=None,
                         metavar=field_kind(name).upper().rstrip("?"),
                         help=f"{field_help(name)} (default: {default!r})", **extra)


def _add_notebooks_parser(sub: Any) -> None:
    course = sub.add_parser("notebooks", help="copy the lecture notebooks and exercises into "
                            "DIR, to run them outside this repository")
    course.add_argument("dir", type=Path, metavar="DIR", help="destination folder")
    course.add_argument("--solutions", action="store_true", help="copy the solutions too")
    course.add_argument("--force", action="store_true", help="overwrite files already there")


def _add_play_parser(sub: Any) -> None:
    play = sub.add_parser("play", help="render episodes of a trained policy as a GIF",
                          formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    play.add_argument("--checkpoint", type=Path, required=True,
                      help="a checkpoint directory (train's OUT/checkpoint)")
    play.add_argument("--episodes", type=int, default=1, help="episodes to play")
    play.add_argument("--out", type=Path, default=Path("play.gif"), help="the GIF to write")
    play.add_argument("--max-frames", type=int, default=2000,
                      help="frames at most over all episodes")
    play.add_argument("--seed", type=int, default=None, help="env and action seed")
    play.add_argument("--greedy", action="store_true",
                      help="the most likely action instead of a sampled one")
    play.add_argument("--fps", type=float, default=15.0, help="frames per second of the GIF")


def config_from_args(args: argparse.Namespace) -> ImpalaConfig:
    values = {name: _parse_value(name, getattr(args, name)) for name in field_names()
              if getattr(args, name) is not None}
    if getattr(args, "preset", "rllib") == "tuned":
        env = values.get("env", ImpalaConfig.__dataclass_fields__["env"].default)
        values = {**TUNED_PRESETS.get(env, {}), **values}
    return ImpalaConfig.from_dict(values)


def _check_run_args(args: argparse.Namespace) -> None:
    for name in ("max_seconds", "report_interval"):
        value = getattr(args, name)
        if value is not None and not (value > 0 and math.isfinite(value)):
            raise ConfigError(f"--{name.replace('_', '-')}={value!r} is invalid: it must be a "
                              "positive number of seconds")
    if args.max_env_steps is not None and args.max_env_steps < 1:
        raise ConfigError(f"--max-env-steps={args.max_env_steps!r} is invalid: it must be >= 1")
    if args.stop_return is not None and not math.isfinite(args.stop_return):
        raise ConfigError(f"--stop-return={args.stop_return!r} is invalid: it must be finite")
    after = args.train_after_target
    if not (after >= 0 and math.isfinite(after)):
        raise ConfigError(f"--train-after-target={after!r} is invalid: it must be a number of "
                          "seconds >= 0")
    if after > 0 and args.stop_return is None:
        raise ConfigError(f"--train-after-target={after!r} is invalid without --stop-return: "
                          "it counts from the moment the target is reached; add "
                          "--stop-return RETURN")


def write_metrics_csv(path: Path, rows: list[dict]) -> None:
    columns: list[str] = []
    for row in rows:
        columns.extend(k for k in row if k not in columns)
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


class TargetWatch:
    """Watches the reports for ``--stop-return``: when it was first reached (seconds from
    process start, env steps, and on the monotonic clock), the mean returns reported from then
    on, and the best trailing mean of the whole run."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.stop_return: float | None = args.stop_return
        self.train_after_target: float = args.train_after_target
        self.seconds: float | None = None
        self.env_steps: int | None = None
        self.at: float | None = None
        self.returns_after: list[float] = []
        self.best_return_mean: float | None = None

    @property
    def reached(self) -> bool:
        return self.at is not None

    def solved(self, s: dict) -> bool:
        return (self.stop_return is not None and s["episode_return_count"] >= 100
                and s["episode_return_mean"] >= self.stop_return)

    def note_best(self, s: dict) -> None:
        ret = s["episode_return_mean"]
        if s["episode_return_count"] >= RETURN_MIN_EPISODES and math.isfinite(ret):
            self.best_return_mean = max(ret, self.best_return_mean or -math.inf)

    def on_report(self, s: dict) -> None:
        self.note_best(s)
        if self.solved(s) and self.at is None:
            self.at = time.monotonic()
            self.seconds = round(self.at - process_start(), 2)
            self.env_steps = s["num_steps_sampled"]
        if self.at is not None:
            self.returns_after.append(s["episode_return_mean"])

    def stop(self, s: dict) -> bool:
        """Reached, and trained ``--train-after-target`` seconds since."""
        return self.at is not None and time.monotonic() - self.at >= self.train_after_target


def train_command(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    _check_run_args(args)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config.to_dict(), indent=2))

    # SIGTERM ends the run like Ctrl-C: results and checkpoint are still written.
    def on_sigterm(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    from impala_lab.driver.impala import Impala

    try:
        impala = Impala(config)
    except KeyboardInterrupt:  # Ctrl-C while TensorFlow loads or workers start
        signal.signal(signal.SIGTERM, previous)
        print(f"impala-lab: interrupted before training started; only {out}/config.json "
              "was written", file=sys.stderr)
        return 130
    except BaseException:  # a config error found while building: the handler goes back
        signal.signal(signal.SIGTERM, previous)
        raise
    try:
        result, error = _train_and_save(impala, config, args, out)
    finally:
        impala.stop()
        signal.signal(signal.SIGTERM, previous)
    if error is not None:
        # The error's own text names the stage, the env and the worker's traceback; the
        # driver's stack under it would only bury that.
        print(f"impala-lab: error: {type(error).__name__}: {error}", file=sys.stderr)
        seen = describe_seen(result["health"])
        saw = f"; health monitor saw: {seen}" if seen else ""
        print(f"impala-lab: the run stopped{saw}; metrics, result and checkpoint are in {out}/",
              file=sys.stderr)
        return 1
    interrupted = result["stop_reason"] == "interrupted"
    print(final_line(result, args, out, interrupted))
    return 130 if interrupted else 0


def _train_and_save(impala: Impala, config: ImpalaConfig, args: argparse.Namespace, out: Path
                    ) -> tuple[dict[str, Any], ImpalaError | None]:
    """Train until a limit, an interrupt or an error, then write every output; returns
    ``result.json``'s dict and the error that ended the run (None if none did)."""
    watch = TargetWatch(args)
    # A terminal gets a progress bar over the live panel, redrawn in place; a log gets one
    # progress line per report.
    view = ProgressView(StopGoal(args.stop_return, args.max_env_steps, args.max_seconds),
                        title=f"{config.env_id} ({config.backend}, {config.num_workers} workers)")

    def on_report(s: dict) -> None:
        watch.on_report(s)
        if not args.quiet:
            view.update(s)

    final, error = _train(impala, args, watch, view, on_report)
    watch.note_best(final)  # a run shorter than one report interval has only its final stats
    ended = time.monotonic()
    view.close()
    impala.stop()
    result = _result(watch, args, final, error, ended)
    _save_outputs(impala, config, out, result)
    return result, error


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


def _result(watch: TargetWatch, args: argparse.Namespace, final: dict[str, Any],
            error: ImpalaError | None, ended: float) -> dict[str, Any]:
    """``result.json``: was the target reached, when, how the run did after it, and why it
    stopped; ``ended`` is when training ended, on the monotonic clock."""
    returns_after = list(watch.returns_after)
    if watch.reached:
        returns_after.append(final["episode_return_mean"])
    finite_after = [r for r in returns_after if math.isfinite(r)]
    return {"solved": watch.reached,
            "stop_return": args.stop_return,
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


def _save_outputs(impala: Impala, config: ImpalaConfig, out: Path, result: dict[str, Any]) -> None:
    """The checkpoint, ``metrics.csv``, ``result.json`` and ``report.png``; a checkpoint or a
    plot that cannot be written is reported on stderr and costs nothing else."""
    try:
        impala.save(out / "checkpoint")
    except Exception as exc:  # e.g. a disk error: the metrics and result still count
        print(f"impala-lab: could not save the checkpoint: {exc}", file=sys.stderr)
    write_metrics_csv(out / "metrics.csv", impala.history.rows())
    (out / "result.json").write_text(json.dumps(jsonable(result), indent=2))
    _save_policy_gif(impala, config, out / "policy.gif")
    try:
        from impala_lab.dashboard.plots import save_report

        save_report(impala.history.rows(), out / "report.png",
                    title=f"{config.env_id} ({config.backend}, {config.num_workers} workers)")
    except Exception as exc:  # a plot must never cost the run's results
        print(f"impala-lab: could not draw report.png: {exc}", file=sys.stderr)


def _save_policy_gif(impala: Impala, config: ImpalaConfig, path: Path) -> None:
    """One episode of the final policy (at most 300 frames) as ``path``, when the env renders
    rgb_array frames; the numpy policy plays it, so it costs a MinAtar run well under a
    second. An env that cannot render (a factory, CartPole without pygame) writes none."""
    if not isinstance(config.env, str):
        return
    from impala_lab.cli.play import policy_model, record_episodes, write_gif

    try:
        weights, _ = impala.policy.get_weights()
        space, actions = impala.observation_space, impala.action_space
        model = policy_model(config, space, actions)
        model.set_weights(weights)
        frames, _ = record_episodes(config.env, model, episodes=1, max_frames=300,
                                    seed=config.seed)
        write_gif(frames, path)
    except Exception as exc:  # a GIF must never cost the run's results
        print(f"impala-lab: no {path.name}: {exc}", file=sys.stderr)


def final_line(result: dict[str, Any], args: argparse.Namespace, out: Path,
               interrupted: bool = False) -> str:
    """The one line ``train`` ends with: was the target reached, and if not, what the health
    monitor saw; where the results are.

    E.g. ``impala-lab: reached mean return 475 in 14.2 s (812,000 env steps); results in
    runs/demo/`` or ``impala-lab: did NOT reach mean return 475 within 300 s (best trailing
    mean 382.1, last 9.3); health monitor saw: value-loss spike at 40 s (3 times), entropy
    collapsed at 41 s; results in runs/demo/``.
    """
    final = result["final"]
    seen = describe_seen(result.get("health"))
    last = final.get("episode_return_mean", math.nan)
    best = result.get("best_return_mean")
    returns = (f"best trailing mean {best:.1f}, last {last:.1f}" if best is not None
               else f"{final.get('episode_return_count', 0)} episodes, too few for a mean")
    elapsed = final.get("time_total_s", 0.0)
    steps = final.get("num_steps_sampled", 0)
    prefix = "impala-lab: interrupted: " if interrupted else "impala-lab: "
    if result["solved"]:
        text = (f"reached mean return {args.stop_return:g} in {result['seconds_to_target']:.1f} s "
                f"({result['env_steps_to_target']:,} env steps)")
        if args.train_after_target > 0:
            low = result["return_min_after_target"]
            text += (f", then trained {result['seconds_after_target']:.1f} s more (lowest mean "
                     f"return {low if low is not None else math.nan:.1f})")
        if seen:
            text += f"; health monitor saw: {seen}"
    elif args.stop_return is not None:
        if interrupted:
            limit = f"before the interrupt at {elapsed:.1f} s"
        elif result["stop_reason"] == "max_env_steps":
            limit = f"within {args.max_env_steps:,} env steps"
        elif result["stop_reason"] == "max_seconds":
            limit = f"within {args.max_seconds:g} s"
        else:
            limit = f"in {elapsed:.1f} s"
        text = (f"did NOT reach mean return {args.stop_return:g} {limit} ({returns}); health "
                f"monitor saw: {seen or 'nothing wrong'}")
    else:
        text = (f"trained {elapsed:.1f} s, {steps:,} env steps (stop: "
                f"{result['stop_reason']}); {returns}")
        if seen:
            text += f"; health monitor saw: {seen}"
    return f"{prefix}{text}; results in {out}/"


def notebooks_command(args: argparse.Namespace) -> int:
    """``impala-lab notebooks DIR``: copies the course; exit code 2 if DIR has its files."""
    from impala_lab.classroom.course import CourseExistsError, NoSolutionsError, copy_course

    try:
        copied = copy_course(args.dir, solutions=args.solutions, force=args.force)
    except (CourseExistsError, NoSolutionsError) as exc:
        more = "; nothing was copied (--force overwrites them)"
        print(f"impala-lab: error: {exc}{more * isinstance(exc, CourseExistsError)}",
              file=sys.stderr)
        return 2
    rel = [p.relative_to(args.dir) for p in copied]
    lectures = sum(len(r.parts) == 1 for r in rel)
    folders = sorted({r.parts[0] for r in rel if len(r.parts) > 1})
    inside = "".join(f", {sum(r.parts[0] == f for r in rel)} in {f}/" for f in folders)
    example = next((r.as_posix() for r in rel if r.parts[0] == "exercises"), "NOTEBOOK.ipynb")
    print(f"impala-lab: copied {lectures} lecture notebooks{inside} to {args.dir}/\n"
          f"  open them:         jupyter lab {args.dir}\n"
          f"  grade an exercise: cd {args.dir} && "
          f"python -m impala_lab.classroom.exercises {example}")
    return 0


def config_command(args: argparse.Namespace) -> int:
    """``impala-lab config``: the README's config table."""
    from impala_lab.config import markdown_table

    print(markdown_table())
    return 0


def play_command(args: argparse.Namespace) -> int:
    """``impala-lab play``: episodes of a checkpoint's policy as a GIF."""
    if args.episodes < 1 or args.max_frames < 1 or not args.fps > 0:
        raise ConfigError(f"--episodes={args.episodes}, --max-frames={args.max_frames} and "
                          f"--fps={args.fps} are invalid: each must be positive")
    from impala_lab.cli.play import play_checkpoint

    try:
        path, returns, frames = play_checkpoint(args.checkpoint, args.out, args.episodes,
                                                args.max_frames, args.seed, args.greedy,
                                                args.fps)
    except (OSError, ValueError) as exc:
        print(f"impala-lab: error: {exc}", file=sys.stderr)
        return 2
    shown = ", ".join(f"{r:g}" for r in returns) or "none finished"
    print(f"impala-lab: wrote {path} ({frames} frames; episode returns: {shown})")
    return 0


#: What each subcommand runs (``build_parser`` builds their options).
COMMANDS = {"train": train_command, "config": config_command, "notebooks": notebooks_command,
            "play": play_command}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except ConfigError as exc:
        print(f"impala-lab: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
