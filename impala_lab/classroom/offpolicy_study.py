"""The IMPALA paper's off-policy study at laptop scale: corrections x replay under policy lag.

The paper's table 2 trains with four corrections (`impala_lab.learner.corrections`), without
and with replay; its figure E.1 varies the lag. This runs the same grid on a small task::

    study = StudySettings(env="CartPole-v1", env_steps=1_000_000, num_seeds=10)
    results = run_study(study, "runs/offpolicy")     # each finished run cached there
    print(table2_markdown(results))                  # IQM [95% interval] per cell
    print(claims_markdown(results))                  # the paper's claims: agrees/differs/...

The actors act ``extra_policy_lag`` updates behind, so the corrections matter on a task that
is otherwise almost on-policy. A study directory holds ``study.json`` (settings, seeds drawn
at random) and a JSON record per run: an interrupted study continues. Each cell is the IQM
over seeds with its bootstrap 95% interval; a claim "agrees" when the interval of a difference
lies on its side of 0, "differs" on the other, else "inconclusive" (docs/off_policy.md).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import secrets
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from impala_lab.classroom import seed_stats
from impala_lab.config import ImpalaConfig

#: The paper's row order in table 2.
CORRECTIONS = ("none", "epsilon", "is1", "vtrace")
LABELS = {"none": "No-correction", "epsilon": "epsilon-correction", "is1": "1-step importance "
          "sampling", "vtrace": "V-trace"}
#: Trailing-100 mean return that counts as solved, per env.
SOLVED_AT = {"CartPole-v1": 475.0}
_BOOTSTRAP_SEED = 0
#: Seeds a side needs before a difference can be judged: a bootstrap of fewer says nothing.
MIN_SEEDS_FOR_VERDICT = 5


@dataclass
class StudySettings:
    """One study: the grid and the budget of each run.

    Attributes:
      extra_policy_lag: K of the table-2 grid (the actors act K learner updates behind).
      replay_proportions: the replay columns (1.0: half of every train batch replayed).
      lags: the lag sweep's values of extra_policy_lag (figure E.1; no replay), each over the
        first ``sweep_seeds`` seeds.
      overrides: config fields on top of the env's tuned preset.
    """

    env: str = "CartPole-v1"
    env_steps: int = 1_000_000
    extra_policy_lag: int = 32
    replay_proportions: tuple[float, ...] = (0.0, 1.0)
    replay_buffer_num_slots: int = 100
    num_seeds: int = 10
    lags: tuple[int, ...] = (0, 32, 128)
    sweep_seeds: int = 10
    corrections: tuple[str, ...] = CORRECTIONS
    overrides: dict[str, Any] = field(default_factory=dict)

    def key(self) -> str:
        """A short hash of the settings: a study directory belongs to one set of them."""
        text = json.dumps(dataclasses.asdict(self), sort_keys=True, default=list)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def study_config(settings: StudySettings, correction: str, replay: float, lag: int,
                 seed: int) -> ImpalaConfig:
    """One run's config: the env's tuned preset, inline workers, a learner queue of 2 (so the
    learner trains on nearly all that is sampled), the correction, replay and lag."""
    return ImpalaConfig.tuned(
        settings.env, backend="inline", num_workers=2, learner_queue_size=2, seed=seed,
        vtrace=correction == "vtrace", off_policy_correction=correction,
        replay_proportion=replay, replay_buffer_num_slots=settings.replay_buffer_num_slots,
        extra_policy_lag=lag, max_policy_lag=max(1000, 4 * lag + 10), **settings.overrides)


def run_one(config: ImpalaConfig, env_steps: int, solved_at: float = math.inf,
            report_interval: float = 0.5) -> dict[str, Any]:
    """Train one run for ``env_steps`` env steps; its record: the learning curve ([env steps,
    trailing mean return]), the final return, the env steps to ``solved_at`` and the lags."""
    from impala_lab.driver.impala import Impala

    curve: list[list[float]] = []
    start = time.monotonic()

    def report(s: dict[str, Any]) -> None:
        if s["episode_return_count"]:
            curve.append([s["num_steps_sampled"], round(s["episode_return_mean"], 2)])

    with Impala(config) as run:
        final = run.train(max_env_steps=env_steps, report_interval=report_interval,
                          on_report=report)
    report(final)
    solved = next((steps for steps, ret in curve if ret >= solved_at), None)
    return {"seed": config.seed, "curve": curve, "final_return": curve[-1][1] if curve else 0.0,
            "solved_at_env_steps": solved,
            "policy_lag_at_training": round(final["policy_lag_at_training"]["mean"], 2),
            "policy_lag": round(final["policy_lag"]["mean"], 2),
            "num_steps_replayed": final["num_steps_replayed"],
            "seconds": round(time.monotonic() - start, 1)}


def _runs(settings: StudySettings, seeds: Sequence[int]) -> list[dict[str, Any]]:
    """Every run of the study: the table's grid, then the sweep's points not in it."""
    runs = [dict(correction=c, replay=r, lag=settings.extra_policy_lag, seed=s)
            for r in settings.replay_proportions for c in settings.corrections for s in seeds]
    for lag in settings.lags:
        for c in settings.corrections:
            for s in seeds[:settings.sweep_seeds]:
                run = dict(correction=c, replay=0.0, lag=lag, seed=s)
                if run not in runs:
                    runs.append(run)
    return runs


def _name(run: dict[str, Any]) -> str:
    return f"{run['correction']}_replay{run['replay']:g}_lag{run['lag']}_seed{run['seed']}"


def study_seeds(settings: StudySettings, directory: Path) -> list[int]:
    """The seeds ``directory/study.json`` holds for these settings, else new random ones."""
    path = directory / "study.json"
    if path.exists():
        saved = json.loads(path.read_text())
        if saved.get("key") == settings.key():
            return list(saved["seeds"])
    seeds = [secrets.randbelow(2**31) for _ in range(settings.num_seeds)]
    directory.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"key": settings.key(), "settings": dataclasses.asdict(settings),
                                "seeds": seeds}, indent=1))
    return seeds


def _run_and_save(settings: StudySettings, run: dict[str, Any], path: Path) -> dict[str, Any]:
    """Train one run of the study and write its record to ``path`` (picklable: jobs > 1)."""
    config = study_config(settings, run["correction"], run["replay"], run["lag"], run["seed"])
    record = {**run, **run_one(config, settings.env_steps,
                               SOLVED_AT.get(settings.env, math.inf))}
    path.write_text(json.dumps(record))
    return record


def run_study(settings: StudySettings, directory: str | Path,
              progress: Callable[[str], None] | None = print, jobs: int = 1) -> dict[str, Any]:
    """Run (or read from ``directory``) every run of the study, ``jobs`` at a time (in
    processes of their own when more than 1). Returns ``{"settings": ..., "seeds": [...],
    "runs": [record + correction, replay, lag]}``."""
    if jobs < 1:
        raise ValueError(f"jobs={jobs!r}: run at least 1 run at a time (jobs=1)")
    directory = Path(directory)
    seeds = study_seeds(settings, directory)
    if progress:
        progress(f"seeds (drawn at random for this study): {seeds}")
    todo = _runs(settings, seeds)
    paths = [directory / f"{_name(run)}.json" for run in todo]
    records: dict[int, dict[str, Any]] = {}

    def finished(i: int, record: dict[str, Any]) -> None:
        records[i] = record
        if progress:
            progress(f"[{len(records)}/{len(todo)}] {_name(todo[i])}: final return "
                     f"{record['final_return']:.1f}, lag at training "
                     f"{record['policy_lag_at_training']}, {record['seconds']} s")

    for i, path in enumerate(paths):
        if path.exists():
            finished(i, json.loads(path.read_text()))
    missing = [i for i in range(len(todo)) if i not in records]
    if jobs == 1:
        for i in missing:
            finished(i, _run_and_save(settings, todo[i], paths[i]))
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        # spawn: a fresh interpreter per worker, never a fork of one holding TF's threads
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {pool.submit(_run_and_save, settings, todo[i], paths[i]): i
                       for i in missing}
            for future in as_completed(futures):
                finished(futures[future], future.result())
    return {"settings": dataclasses.asdict(settings), "seeds": seeds,
            "runs": [records[i] for i in range(len(todo))]}


# ---------------------------------------------------------------------- what the study found
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
