"""``python -m bench.seeds``: one config (or several) on N seeds, with intervals.

Each setting is a command line; every seed runs it once, as a fresh process, and the runner
reads the run's ``metrics.csv``. Per setting and figure (``--metric``, a metrics.csv column)
it reports n, the solve rate (``--solve-return``: the figure reached it at some report), and
the interquartile mean with a bootstrap 95% interval (`impala_lab.classroom.seed_stats`) of:

- the final value: the figure's last finite value in the run (its last row);
- the area under its curve: its mean over the budget (``--budget``, in ``--x`` units; the
  longest run's span by default), a report's value held until the next.

Two or more settings are compared pairwise on each figure ("A better", "B better" or
"inconclusive" from the interval of the difference of their IQMs, n per side); two or more
figures of one setting are compared run by run (a paired interval) with
``--compare-metrics``. Seeds are drawn at random
for each invocation and printed (``--seeds`` gives them); every setting runs on the same
seeds, in an order that rotates from seed to seed, ``--jobs`` runs at a time (by default the
cores / 2: an impala_lab run keeps two cores busy).

    python -m bench.seeds --n 10 --solve-return 475 --metric episode_return_mean \\
        --setting tuned="train --env CartPole-v1 --max-seconds 60"
    python -m bench.seeds --seeds 1,2,3 --setting a="train --lr 0.001" \\
        --setting b="train --lr 0.003"

A command starting with ``train`` (or ``impala-lab train``) runs ``python -m
impala_lab.cli.main train ...`` and gets ``--seed S --out DIR --quiet`` appended; any other
command must hold ``{seed}`` and ``{out}`` (where it writes metrics.csv). The outputs:
``seeds.json``, ``seeds.md`` and ``seeds.png`` in ``--out`` (default ``runs/seeds``), and
each run's own directory under it.

Run again over the same folder (after a kill, say), a train run that was killed with the same
command is resumed from its checkpoint (``--resume``), and any other earlier run in its
folder is replaced (``--overwrite``): a run's metrics are never another run's. A run that
fails (a non-zero exit) is reported as failed, and the command then exits 1; bad arguments
exit 2 with one line; SIGTERM, SIGHUP or Ctrl-C end the runs in flight (each writes its
outputs) and then the command, with 128 + the signal.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import sys
from pathlib import Path
from typing import Any

import numpy as np

from bench import seed_summary
from bench.seed_runs import Run, ending, fail, on_signal, plan_runs, run_all
from impala_lab.classroom import seed_stats


# ---------------------------------------------------------------------- the figures
def run_figures(run: Run, metric: str, budget: float, solve_return: float | None
                ) -> dict[str, Any]:
    """One run's final value, area under the curve (mean over the budget) and whether the
    figure reached ``solve_return``; NaN (and not solved) for a run that failed."""
    xs, ys = run.curves.get(metric, ([], []))
    finite = [y for y in ys if math.isfinite(y)]
    failed = bool(run.error) or not finite
    return {"seed": run.seed,
            "final": math.nan if failed else finite[-1],
            "auc": math.nan if failed else seed_summary.area_under_curve(xs, ys, budget),
            "solved": (not failed and solve_return is not None
                       and max(finite) >= solve_return),
            "error": run.error}


def default_budget(runs: list[Run], metrics: list[str]) -> float:
    """The longest span on the x axis over the runs (the budget every area is normalised by)."""
    spans = [max((x for x in run.curves[m][0] if math.isfinite(x)), default=0.0)
             for run in runs for m in metrics if m in run.curves]
    return max(spans, default=math.nan)


def analyse(runs: list[Run], metrics: list[str], budget: float, solve_return: float | None,
            rng: np.random.Generator, compare_metrics: bool = False) -> dict[str, Any]:
    """Per setting and metric: each run's figures and their summaries; then the comparisons
    between settings (per metric) and, with ``compare_metrics``, of each metric with the
    first one (per setting, paired by run: figures on one scale, e.g. two returns)."""
    settings = list(dict.fromkeys(run.setting for run in runs))
    per: dict[str, dict[str, Any]] = {}
    for name in settings:
        mine = sorted((r for r in runs if r.setting == name), key=lambda r: r.seed)
        per[name] = {}
        for metric in metrics:
            rows = [run_figures(r, metric, budget, solve_return) for r in mine]
            per[name][metric] = {
                "runs": rows, "failed": sum(bool(r["error"]) for r in rows),
                "final": seed_summary.summarize([r["final"] for r in rows], rng, solve_return,
                                              [r["solved"] for r in rows]),
                "auc": seed_summary.summarize([r["auc"] for r in rows], rng)}
    return {"settings": per, "between_settings": _between_settings(per, metrics, rng),
            "between_metrics": _between_metrics(per, metrics, rng) if compare_metrics else []}


def _compare(a: list[float], b: list[float], names: tuple[str, str],
             rng: np.random.Generator, paired: bool) -> dict[str, Any]:
    if paired:  # only runs where both figures exist
        both = [(x, y) for x, y in zip(a, b, strict=True) if math.isfinite(x + y)]
        a, b = [x for x, _ in both], [y for _, y in both]
    else:
        a = [x for x in a if math.isfinite(x)]
        b = [y for y in b if math.isfinite(y)]
    diff, low, high = seed_stats.difference_interval(a, b, rng, paired=paired)
    return {"a": names[0], "b": names[1], "n_a": len(a), "n_b": len(b),
            "iqm_difference": diff, "ci95": [low, high],
            "verdict": seed_summary.verdict(low, high, names)}


def _between_settings(per: dict[str, Any], metrics: list[str], rng: np.random.Generator
                      ) -> list[dict[str, Any]]:
    out = []
    names = list(per)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            for metric in metrics:
                for figure in ("final", "auc"):
                    values = [[r[figure] for r in per[s][metric]["runs"]] for s in (a, b)]
                    out.append({"metric": metric, "figure": figure,
                                **_compare(*values, (a, b), rng, paired=False)})
    return out


def _between_metrics(per: dict[str, Any], metrics: list[str], rng: np.random.Generator
                     ) -> list[dict[str, Any]]:
    out = []
    for name, by_metric in per.items():
        first = metrics[0]
        for metric in metrics[1:]:
            for figure in ("final", "auc"):
                values = [[r[figure] for r in by_metric[m]["runs"]] for m in (metric, first)]
                out.append({"setting": name, "figure": figure,
                            **_compare(*values, (metric, first), rng, paired=True)})
    return out


# ---------------------------------------------------------------------- the report
def _interval(summary: dict[str, Any]) -> str:
    low, high = summary["ci95"]
    return f"{summary['iqm']:.1f} [{low:.1f}, {high:.1f}]"


def markdown(report: dict[str, Any]) -> str:
    """The report as markdown: a table per metric, then the comparisons."""
    a = report["analysis"]
    solve = report["solve_return"]
    lines = [f"Seeds ({len(report['seeds'])}, drawn {report['seeds_drawn']}): "
             f"{', '.join(map(str, report['seeds']))}. Final: the figure's last value; AUC: "
             f"its mean over the budget of {report['budget']:g} ({report['x']}). IQM "
             f"[bootstrap 95% interval].", ""]
    for metric in report["metrics"]:
        lines += [f"**{metric}**", "",
                  "| setting | n | failed | solved"
                  + (f" (>= {solve:g})" if solve is not None else "")
                  + " | final IQM [95%] | final median | final worst | AUC IQM [95%] |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for name, by_metric in a["settings"].items():
            m = by_metric[metric]
            fin, auc = m["final"], m["auc"]
            solved = f"{fin['solved']}/{fin['n']}" if solve is not None else "-"
            lines.append(f"| {name} | {fin['n']} | {m['failed']} | {solved} | "
                         f"{_interval(fin)} | {fin['median']:.1f} | {fin['worst']:.1f} | "
                         f"{_interval(auc)} |")
        lines.append("")
    for title, key in (("Between settings", "between_settings"),
                       ("Between figures of the same runs (paired)", "between_metrics")):
        if a[key]:
            lines += [f"{title}: IQM(A) - IQM(B) [95%]", ""]
            for c in a[key]:
                where = c.get("metric") or c.get("setting")
                lines.append(f"- {where}, {c['figure']}: {c['a']} (n={c['n_a']}) vs {c['b']} "
                             f"(n={c['n_b']}): {c['iqm_difference']:+.1f} "
                             f"[{c['ci95'][0]:+.1f}, {c['ci95'][1]:+.1f}]: {c['verdict']}")
            lines.append("")
    return "\n".join(lines)


def plot(runs: list[Run], report: dict[str, Any], path: Path) -> None:
    """One panel per metric: every run's curve, thin, coloured by setting."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = report["metrics"]
    fig, axes = plt.subplots(1, len(metrics), figsize=(6 * len(metrics), 4), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    settings = list(report["analysis"]["settings"])
    for ax, metric in zip(axes[0], metrics, strict=True):
        for run in runs:
            xs, ys = run.curves.get(metric, ([], []))
            colour = colours[settings.index(run.setting) % len(colours)]
            ax.plot(xs, ys, color=colour, lw=1, alpha=0.6)
        for i, name in enumerate(settings):
            fin = report["analysis"]["settings"][name][metric]["final"]
            ax.plot([], [], color=colours[i % len(colours)],
                    label=f"{name}: final IQM {_interval(fin)}, n={fin['n']}")
        ax.set_title(metric)
        ax.set_xlabel(report["x"])
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---------------------------------------------------------------------- the command
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.seeds", description=__doc__.split(
        "\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--setting", action="append", default=[], metavar="NAME=COMMAND",
                   help="a setting to run (repeat for several); see the module docstring")
    p.add_argument("--n", type=int, default=10, help="seeds to draw at random")
    p.add_argument("--seeds", default=None, help="comma-separated seeds instead of --n")
    p.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) // 2),
                   help="runs at once (default: cores / 2)")
    p.add_argument("--metric", action="append", default=None,
                   help="a metrics.csv column to report (repeat; default episode_return_mean)")
    p.add_argument("--x", default="time_total_s",
                   help="the x axis column: time_total_s or num_steps_sampled")
    p.add_argument("--budget", type=float, default=None,
                   help="the x span each AUC is normalised by (default: the longest run's)")
    p.add_argument("--solve-return", type=float, default=None,
                   help="a run counts as solved (per metric) when the metric reached this at "
                   "some report")
    p.add_argument("--compare-metrics", action="store_true",
                   help="compare each metric with the first, run by run (paired): for figures "
                   "on one scale, such as the training and the evaluation return")
    p.add_argument("--timeout", type=float, default=None, help="seconds a run may take")
    p.add_argument("--out", type=Path, default=Path("runs/seeds"), help="output directory")
    p.add_argument("--bootstrap-seed", type=int, default=None,
                   help="seed of the bootstrap's generator (default: drawn at random)")
    args = p.parse_args(argv)
    if not args.setting:
        fail("give at least one --setting NAME=COMMAND")
    for s in args.setting:
        if "=" not in s or not s.split("=", 1)[0]:
            fail(f"--setting {s!r} is invalid: write NAME=COMMAND, e.g. "
                 "tuned=\"train --env CartPole-v1 --max-seconds 60\"")
    if args.seeds is not None:
        text = args.seeds
        try:
            args.seeds = [int(x) for x in text.split(",")]
        except ValueError:
            args.seeds = [-1]
        if min(args.seeds) < 0:
            fail(f"--seeds {text!r} is invalid: give integers >= 0 separated by commas, e.g. "
                 "--seeds 1,2,3")
    elif args.n < 1:
        fail(f"--n {args.n} is invalid: it must be >= 1")
    if args.jobs < 1:
        fail(f"--jobs {args.jobs} is invalid: it must be >= 1")
    if args.timeout is not None and not (args.timeout > 0 and math.isfinite(args.timeout)):
        fail(f"--timeout {args.timeout:g} is invalid: give a positive number of seconds")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run every setting on every seed, print and write the report; return it. A signal
    ends the runs in flight and raises SystemExit(128 + the signal); a metric that is no
    column of the runs' metrics.csv SystemExit(2)."""
    args = parse_args(argv)
    settings = dict(s.split("=", 1) for s in args.setting)
    metrics = args.metric or ["episode_return_mean"]
    drawn = args.seeds is None
    seeds = ([random.SystemRandom().randrange(2**31) for _ in range(args.n)] if drawn
             else args.seeds)
    runs = plan_runs(settings, seeds, args.out)  # checks the commands first
    print(f"bench.seeds: seeds {'drawn at random' if drawn else 'given'}: "
          f"{', '.join(map(str, seeds))}; {len(settings)} setting(s), {args.jobs} at once",
          flush=True)
    ending.clear()
    previous = {sig: signal.signal(sig, on_signal)
                for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    try:
        runs = run_all(runs, args.jobs, args.x, metrics, args.timeout)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if ending and isinstance(ending[0], int):
        print(f"bench.seeds: ended by signal {ending[0]}: the runs in flight were ended "
              "(each wrote its outputs); no report", file=sys.stderr)
        raise SystemExit(128 + ending[0])
    if ending:
        fail(f"--metric or --x {ending[0]}")
    for run in runs:
        if run.how != "new":
            print(f"bench.seeds: {run.setting} seed {run.seed}: an earlier run in {run.out} "
                  f"was {run.how}", flush=True)
    budget = args.budget if args.budget is not None else default_budget(runs, metrics)
    boot_seed = (args.bootstrap_seed if args.bootstrap_seed is not None
                 else random.SystemRandom().randrange(2**31))
    analysis = analyse(runs, metrics, budget, args.solve_return,
                       np.random.default_rng(boot_seed), args.compare_metrics)
    failed = sum(bool(r.error) for r in runs)
    report = {"settings": settings, "seeds": seeds,
              "seeds_drawn": "at random" if drawn else "by --seeds", "metrics": metrics,
              "x": args.x, "budget": budget, "solve_return": args.solve_return,
              "jobs": args.jobs, "bootstrap_seed": boot_seed,
              "cpu_count": os.cpu_count(), "load_average": list(os.getloadavg()),
              "failed_runs": failed, "analysis": analysis}
    text = markdown(report)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "seeds.json").write_text(json.dumps(report, indent=2, default=str))
    (args.out / "seeds.md").write_text(text + "\n")
    try:
        plot(runs, report, args.out / "seeds.png")
    except Exception as exc:  # a plot must never cost the figures
        print(f"bench.seeds: no seeds.png: {exc}", file=sys.stderr)
    if failed:
        print(f"bench.seeds: {failed} of {len(runs)} runs FAILED (their errors are above and "
              "in seeds.json)", file=sys.stderr)
    return report


def exit_code(report: dict[str, Any]) -> int:
    """0, or 1 when a run failed."""
    return 1 if report["failed_runs"] else 0


if __name__ == "__main__":
    sys.exit(exit_code(main()))
