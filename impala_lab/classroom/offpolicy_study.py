"""The IMPALA paper's off-policy study at laptop scale: corrections x replay under policy lag.

The paper's table 2 trains with four corrections (`impala_lab.learner.corrections`), without
and with replay; its figure E.1 varies the lag. This runs the same grid on a small task::

    study = StudySettings(env="CartPole-v1", env_steps=1_000_000, num_seeds=10)
    results = run_study(study, "runs/offpolicy")     # each finished run cached there
    print(table2_markdown(results))                  # IQM [95% interval] per cell
    print(claims_markdown(results))                  # the paper's claims: agrees/differs/...

The actors act ``extra_policy_lag`` updates behind, so the corrections matter on a task that
is otherwise almost on-policy. A study directory holds ``study.json`` (settings, seeds drawn
at random) and a JSON record per run: an interrupted study continues. docs/off_policy.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from impala_lab.classroom.offpolicy_summary import (  # noqa: F401  (the study's summaries)
    CORRECTIONS,
    LABELS,
    SOLVED_AT,
    cell,
    claims_markdown,
    paper_claims,
    plot_study,
    run_mean,
    select,
    sweep,
    sweep_markdown,
    table2,
    table2_markdown,
)
from impala_lab.config import ImpalaConfig


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
