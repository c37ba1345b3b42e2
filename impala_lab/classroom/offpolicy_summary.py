"""What an off-policy study found (`impala_lab.classroom.offpolicy_study`), with intervals.

Each cell gives the IQM over seeds and its bootstrap 95% interval (`seed_stats`, fixed seed)
of the final return (the paper's table 2) and `run_mean`. A claim "agrees" when the interval
of a difference of IQMs lies on the claim's side of 0, "differs" on the other, else
"inconclusive".
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from impala_lab.classroom import seed_stats

#: The paper's row order in table 2.
CORRECTIONS = ("none", "epsilon", "is1", "vtrace")
LABELS = {"none": "No-correction", "epsilon": "epsilon-correction", "is1": "1-step importance "
          "sampling", "vtrace": "V-trace"}
#: Trailing-100 mean return that counts as solved, per env.
SOLVED_AT = {"CartPole-v1": 475.0}
_BOOTSTRAP_SEED = 0
#: Seeds a side needs before a difference can be judged: a bootstrap of fewer says nothing.
MIN_SEEDS_FOR_VERDICT = 5


def select(results: dict[str, Any], **match: Any) -> list[dict[str, Any]]:
    """The runs whose fields equal ``match`` (e.g. ``correction="vtrace", replay=0.0``)."""
    return [r for r in results["runs"] if all(r[k] == v for k, v in match.items())]


def run_mean(record: dict[str, Any]) -> float:
    """The learning curve's mean over the env steps of the run (the area under it divided by
    its length): early learning and late collapses both count, unlike the final return."""
    curve = np.array(record["curve"], dtype=np.float64)
    if len(curve) < 2:
        return float(curve[0, 1]) if len(curve) else math.nan
    steps, returns = curve[:, 0], curve[:, 1]
    area = np.sum((returns[1:] + returns[:-1]) / 2 * np.diff(steps))
    return float(area / (steps[-1] - steps[0]))


def _figures(runs: Sequence[dict[str, Any]], figure: str) -> list[float]:
    if figure == "final":
        return [float(r["final_return"]) for r in runs]
    if figure == "run_mean":
        return [run_mean(r) for r in runs]
    raise ValueError(f"figure={figure!r}: use 'final' or 'run_mean'")


def cell(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Of some runs: n; IQM and 95% interval of the final return (``final``, ``final_ci``)
    and of `run_mean`; median, worst and best final return; median peak; runs that ever
    reached the env's `SOLVED_AT`."""
    rng = np.random.default_rng(_BOOTSTRAP_SEED)
    finals, means = _figures(runs, "final"), _figures(runs, "run_mean")
    peaks = [max((ret for _, ret in r["curve"]), default=math.nan) for r in runs]
    return {"n": len(runs),
            "final": seed_stats.iqm(finals), "final_ci": seed_stats.bootstrap_interval(finals, rng),
            "run_mean": seed_stats.iqm(means),
            "run_mean_ci": seed_stats.bootstrap_interval(means, rng),
            "median": float(np.median(finals)) if finals else math.nan,
            "worst": min(finals, default=math.nan), "best": max(finals, default=math.nan),
            "peak": float(np.median(peaks)) if peaks else math.nan,
            "solved": sum(r["solved_at_env_steps"] is not None for r in runs)}


def table2(results: dict[str, Any]) -> dict[str, dict[float, dict[str, Any]]]:
    """``{correction: {replay: cell}}`` of the table-2 grid (the study's extra_policy_lag)."""
    s = results["settings"]
    return {c: {r: cell(select(results, correction=c, replay=r, lag=s["extra_policy_lag"]))
                for r in s["replay_proportions"]}
            for c in s["corrections"]}


def _interval(value: float, ci: Sequence[float]) -> str:
    return f"{value:.0f} [{ci[0]:.0f}, {ci[1]:.0f}]"


def _markdown(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A markdown table: a header row, then `rows`."""
    lines = [head, ["---"] * len(head), *rows]
    return "\n".join("| " + " | ".join(line) + " |" for line in lines)


def table2_markdown(results: dict[str, Any]) -> str:
    """Table 2 laid out as the paper's (a row per correction, a column per replay setting):
    the final return's IQM [95% interval] (a column's highest in bold), the run mean's, and
    the runs that ever reached the solve threshold."""
    s = results["settings"]
    table = table2(results)
    solved_at = SOLVED_AT.get(s["env"], math.inf)
    heads = ["No replay" if r == 0 else f"replay_proportion {r:g}"
             for r in s["replay_proportions"]]
    rows = []
    best = {r: max(table[c][r]["final"] for c in table) for r in s["replay_proportions"]}
    for c, cells in table.items():
        texts = []
        for r, x in cells.items():
            final = _interval(x["final"], x["final_ci"])
            if x["final"] == best[r]:
                final = f"**{final}**"
            texts.append(f"final {final} · run mean {_interval(x['run_mean'], x['run_mean_ci'])}"
                         f" · {solved_at:g} reached {x['solved']}/{x['n']}")
        rows.append([LABELS[c], *texts])
    return _markdown([f"{s['env']}, extra_policy_lag {s['extra_policy_lag']}", *heads], rows)


def sweep(results: dict[str, Any]) -> dict[str, dict[int, dict[str, Any]]]:
    """``{correction: {lag: cell}}`` of the lag sweep (no replay; the sweep's seeds)."""
    s = results["settings"]
    seeds = results["seeds"][:s["sweep_seeds"]]
    return {c: {lag: cell([r for r in select(results, correction=c, replay=0.0, lag=lag)
                           if r["seed"] in seeds])
                for lag in s["lags"]}
            for c in s["corrections"]}


def sweep_markdown(results: dict[str, Any]) -> str:
    """The lag sweep as a table: a row per correction, a column per extra_policy_lag; each
    cell the run mean's IQM [95% interval] and the final return's."""
    rows = [[LABELS[c], *(f"run mean {_interval(x['run_mean'], x['run_mean_ci'])} · final "
                          f"{_interval(x['final'], x['final_ci'])}" for x in cells.values())]
            for c, cells in sweep(results).items()]
    lags = results["settings"]["lags"]
    return _markdown(["correction", *(f"lag {lag}" for lag in lags)], rows)


def paper_claims(results: dict[str, Any], figure: str = "final") -> list[dict[str, Any]]:
    """The paper's findings of table 2 and figure E.1, each checked on ``figure`` ("final"
    or "run_mean"): a dict per claim with its ``verdict`` and ``tests``, the differences it
    rests on (``a``, ``b``, ``difference`` = IQM(a) - IQM(b), ``ci95``, ``n``, ``verdict``).
    A claim agrees when all its tests agree, differs when any differs."""
    s = results["settings"]
    lag = s["extra_policy_lag"]
    top = max(s["lags"])

    def at(c: str, replay: float = 0.0, lag_: int = lag) -> dict[str, Any]:
        return {"correction": c, "replay": replay, "lag": lag_}

    # claim -> the pairs (a, b, "a above b" (True) or "a not above b" (False))
    claims = {
        "no replay: V-trace ahead of no correction": [(at("vtrace"), at("none"), True)],
        "no replay: V-trace ahead of epsilon-correction": [(at("vtrace"), at("epsilon"), True)],
        "no replay: 1-step IS ahead of no correction": [(at("is1"), at("none"), True)],
        "replay: V-trace ahead of every other correction": [
            (at("vtrace", 1.0), at(c, 1.0), True) for c in s["corrections"] if c != "vtrace"],
        "V-trace gains from replay": [(at("vtrace", 1.0), at("vtrace"), True)],
        "no other correction gains from replay": [
            (at(c, 1.0), at(c), False) for c in s["corrections"] if c != "vtrace"],
        f"lag {top}: V-trace ahead of no correction": [
            (at("vtrace", 0.0, top), at("none", 0.0, top), True)],
    }
    found = []
    for claim, pairs in claims.items():
        tests = []
        for a, b, above in pairs:
            x, y = _figures(select(results, **a), figure), _figures(select(results, **b), figure)
            diff, low, high = seed_stats.difference_interval(
                x, y, np.random.default_rng(_BOOTSTRAP_SEED))
            verdict = "inconclusive"
            if min(len(x), len(y)) >= MIN_SEEDS_FOR_VERDICT and (low > 0 or high < 0):
                # a difference beyond doubt: on the claim's side ("a above b", or for "a not
                # above b" a loss), or against it
                verdict = "agrees" if (low > 0) == above else "differs"
            tests.append({"a": a, "b": b, "difference": diff, "ci95": (low, high),
                          "n": (len(x), len(y)), "verdict": verdict})
        verdicts = [t["verdict"] for t in tests]
        verdict = ("differs" if "differs" in verdicts else
                   "agrees" if all(v == "agrees" for v in verdicts) else "inconclusive")
        found.append({"claim": claim, "verdict": verdict, "tests": tests})
    return found


def claims_markdown(results: dict[str, Any]) -> str:
    """`paper_claims` on both figures, a row per claim; each verdict with the deciding
    difference of IQMs [95% interval] and the n of each side."""
    rows = []
    by_figure = {f: paper_claims(results, f) for f in ("final", "run_mean")}
    for k, claim in enumerate(by_figure["final"]):
        texts = []
        for f in ("final", "run_mean"):
            c = by_figure[f][k]
            t = max((t for t in c["tests"] if t["verdict"] == c["verdict"]),
                    key=lambda t: abs(t["difference"]))
            low, high = t["ci95"]
            texts.append(f"{c['verdict']} ({t['difference']:+.0f} [{low:+.0f}, {high:+.0f}], "
                         f"n {t['n'][0]} vs {t['n'][1]})")
        rows.append([claim["claim"], *texts])
    return _markdown(["the paper's finding", "on the final return", "on the run mean"], rows)


def plot_study(results: dict[str, Any], path: str | Path | None = None) -> Any:
    """The table's learning curves (a panel per replay setting: median and interquartile
    band over seeds) and the lag sweep (run mean's IQM, 95% interval); saved to ``path``."""
    import matplotlib.pyplot as plt

    s = results["settings"]
    panels = len(s["replay_proportions"]) + 1
    fig, axes = plt.subplots(1, panels, figsize=(4.6 * panels, 3.6))
    grid = np.linspace(0, s["env_steps"], 60)
    colors = dict(zip(CORRECTIONS, ("#7f7f7f", "#8e44ad", "#d35400", "#1f77b4"), strict=True))
    for ax, replay in zip(axes, s["replay_proportions"], strict=False):
        for c in s["corrections"]:
            runs = select(results, correction=c, replay=replay, lag=s["extra_policy_lag"])
            curves = [np.interp(grid, *np.array(r["curve"]).T, left=np.nan)
                      for r in runs if r["curve"]]
            if not curves:
                continue
            stack = np.array(curves)
            with warnings.catch_warnings():  # before a run's first episode ends: NaN
                warnings.simplefilter("ignore", RuntimeWarning)
                low, mid, high = np.nanpercentile(stack, [25, 50, 75], axis=0)
            ax.plot(grid, mid, color=colors[c], label=LABELS[c])
            ax.fill_between(grid, low, high, color=colors[c], alpha=0.15)
        title = "no replay" if replay == 0 else f"replay_proportion {replay:g}"
        ax.set(title=f"{title}, extra lag {s['extra_policy_lag']}", xlabel="env steps",
               ylabel="mean return (last 100)")
    axes[0].legend(fontsize=8)
    ax = axes[-1]
    for c, cells in sweep(results).items():
        lags = np.array(list(cells), dtype=float)
        mid = np.array([x["run_mean"] for x in cells.values()])
        ci = np.array([x["run_mean_ci"] for x in cells.values()])
        ax.errorbar(lags, mid, yerr=[mid - ci[:, 0], ci[:, 1] - mid], fmt="o-", capsize=3,
                    color=colors[c], label=LABELS[c])
    ax.set(xscale="symlog", xlabel="extra_policy_lag (learner updates)",
           ylabel="run mean return (IQM, 95% interval)", title="lag sweep, no replay")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=90)
    return fig
