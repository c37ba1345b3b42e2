"""The ``impala-lab`` command.

    impala-lab train --env CartPole-v1 --stop-return 475 --out runs/cartpole
    impala-lab config                      # the config table
    impala-lab play --checkpoint runs/breakout/checkpoint --episodes 3 --out breakout.gif
    impala-lab notebooks my-course         # copy the course's notebooks (--solutions too)

Every `ImpalaConfig` field is a ``train`` option (``--field-name value``). Bad input exits
with code 2 and a message naming the option, the value and the fix, before anything starts.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path
from typing import Any

from impala_lab import speed
from impala_lab.cli.endings import open_std_streams, say
from impala_lab.cli.train import resume_overrides, train_command
from impala_lab.config import GROUPS, ImpalaConfig, field_group, field_help, field_kind, field_names
from impala_lab.errors import ConfigError
from impala_lab.presets import TUNED_PRESETS
from impala_lab.speed import lean_imports


def build_parser() -> argparse.ArgumentParser:
    """The parser of every subcommand; ``main`` runs ``COMMANDS[args.command]``."""
    parser = argparse.ArgumentParser(prog="impala-lab", description="IMPALA, as RLlib built it, "
                                     "for learning and experiments.")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_train_parser(sub)
    sub.add_parser("config", help="print the config table (markdown)")
    course = sub.add_parser("notebooks", help="copy the lecture notebooks, the exercises, the "
                            "notation table and IMPALA in one file into DIR, to run them "
                            "outside this repository")
    course.add_argument("dir", type=Path, metavar="DIR", help="destination folder")
    course.add_argument("--solutions", action="store_true", help="copy the solutions too")
    course.add_argument("--force", action="store_true", help="overwrite files already there")
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
    return parser


class _DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Argparse's defaults formatter, without "(default: None)" (a field's help says it)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None:
            return action.help
        return super()._get_help_string(action)


def _add_train_parser(sub: Any) -> None:
    train = sub.add_parser("train", help="train a policy", formatter_class=_DefaultsFormatter)
    run = train.add_argument_group("run: limits and target (kept by a plain --resume)")
    run.add_argument("--stop-return", type=float, default=None,
                     help="stop once the mean return of the last 100 episodes reaches this")
    run.add_argument("--stop-on", choices=("train", "eval"), default=None,
                     help="which return --stop-return watches: the actors' (the lagged "
                     "behaviour policy, mean of the last 100 episodes) or the latest "
                     "evaluation of the learner's weights (greedy where played; needs "
                     "--evaluation-interval) (default: train)")
    run.add_argument("--max-seconds", type=float, default=None,
                     help="wall-clock limit of the whole training (with --train-after-target "
                     "too: leave room for both phases; a resumed run trains what is left)")
    run.add_argument("--max-env-steps", type=int, default=None, help="env step limit")
    run.add_argument("--train-after-target", type=float, default=None, metavar="SECONDS",
                     help="once --stop-return is reached, keep training this many seconds "
                     "more; result.json then says the lowest mean return after the target "
                     "(return_min_after_target) (default: 0)")
    out = train.add_argument_group("outputs and checkpoints")
    out.add_argument("--out", default=None,
                     help="output folder: one run per folder; a folder holding an earlier run "
                     "or other files is refused unless --overwrite (default: runs/latest)")
    out.add_argument("--overwrite", action="store_true",
                     help="replace the earlier run in --out, and write beside files that are "
                     "not a run's")
    out.add_argument("--resume", default=None, metavar="DIR",
                     help="continue the run in DIR from its last checkpoint (weights, "
                     "optimizer, counters, metrics cut back to it, its limits and flags); "
                     "config and run flags given with it replace the run's")
    out.add_argument("--checkpoint-every", type=float, default=None, metavar="SECONDS",
                     help="save OUT/checkpoint this often while training (atomically), so a "
                     "killed run can be resumed; 0 saves only at the end (default: 60)")
    out.add_argument("--report-interval", type=float, default=None,
                     help="seconds between progress lines and metrics.csv rows (default: 1)")
    out.add_argument("--quiet", action="store_true",
                     help="no progress bar (in a terminal) or progress lines (elsewhere)")
    out.add_argument("--tensorboard", action="store_true", default=None,
                     help="write TensorBoard summaries of every report into OUT/tensorboard "
                     "(make tensorboard opens them)")
    run.add_argument("--preset", choices=("tuned", "rllib"), default="tuned",
                     help="defaults for fields you do not set: 'tuned' uses the values tuned "
                     "for the env where there are some (CartPole-v1), 'rllib' RLlib's defaults")
    groups = {group: train.add_argument_group(f"config, {group}: {title}")
              for group, title in GROUPS.items()}
    defaults = ImpalaConfig.__dataclass_fields__
    default_env = defaults["env"].default
    tuned = TUNED_PRESETS.get(default_env, {})
    for name in field_names():
        default = defaults[name].default
        # The run takes the tuned value where the env has one: say both, or --help misleads.
        where = (f"; {tuned[name]!r} in {default_env}'s tuned preset"
                 if name in tuned and tuned[name] != default else "")
        extra = {"nargs": "?", "const": "true"} if field_kind(name) == "bool" else {}
        groups[field_group(name)].add_argument(
            "--" + name.replace("_", "-"), dest=name, default=None,
            metavar=field_kind(name).upper().rstrip("?"),
            help=f"{field_help(name)} (default: {default!r}{where})", **extra)


def config_from_args(args: argparse.Namespace) -> ImpalaConfig:
    """The config of ``train``'s options (with ``--preset tuned``, the env's tuned values for
    the fields not given)."""
    values = resume_overrides(args)
    if getattr(args, "preset", "rllib") == "tuned":
        env = values.get("env", ImpalaConfig.__dataclass_fields__["env"].default)
        values = {**TUNED_PRESETS.get(env, {}), **values}
    return ImpalaConfig.from_dict(values)


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
    lectures = sum(len(r.parts) == 1 and r.suffix == ".ipynb" for r in rel)
    folders = sorted({r.parts[0] for r in rel if len(r.parts) > 1})
    inside = "".join(f", {sum(r.parts[0] == f for r in rel)} in {f}/" for f in folders)
    inside += "".join(f", {r}" for r in rel if len(r.parts) == 1 and r.suffix != ".ipynb")
    example = next((r.as_posix() for r in rel if r.parts[0] == "exercises"), "NOTEBOOK.ipynb")
    print(f"impala-lab: copied {lectures} lecture notebooks{inside} to {args.dir}/\n"
          f"  open them:         jupyter lab {args.dir}\n"
          f"  check an exercise: run the last cell of {args.dir}/{example} in Jupyter")
    return 0


def config_command(args: argparse.Namespace) -> int:
    """``impala-lab config``: every config field by role, its default and what it does."""
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
COMMANDS = {"train": lambda args: train_command(args, config_from_args(args)),
            "config": config_command, "notebooks": notebooks_command,
            "play": play_command}


def main(argv: list[str] | None = None) -> int:
    """The ``impala-lab`` command; ``argv`` None reads ``sys.argv`` (the program itself), which
    also turns on `impala_lab.speed.lean_imports` and `impala_lab.speed.freeze_before_exit`."""
    open_std_streams()  # `impala-lab train >&-`: no file of the run may take fd 1's place
    if argv is None:
        lean_imports.enable()
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        return _unknown_options(parser, args, unknown)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # the Ray watchman reruns it
    try:
        return COMMANDS[args.command](args)
    except ConfigError as exc:
        say(f"impala-lab: error: {exc}", err=True)
        return 2
    finally:
        if argv is None:
            speed.freeze_before_exit()


def _unknown_options(parser: argparse.ArgumentParser, args: argparse.Namespace,
                     unknown: list[str]) -> int:
    """One line for options the command does not know, with the closest known ones."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    known = [o for a in sub.choices[args.command]._actions for o in a.option_strings]
    parts = []
    for word in unknown:
        close = (difflib.get_close_matches(word.split("=")[0], known, n=2, cutoff=0.6)
                 if word.startswith("-") else [])
        parts.append(f"{word} (did you mean {' or '.join(close)}?)" if close else word)
    words = ", ".join(parts)
    print(f"impala-lab {args.command}: error: unrecognized arguments: {words}; "
          f"see impala-lab {args.command} --help", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
