"""The printed table, the README's markdown and the figure of ``python -m bench``'s results.

`bench.__main__` measures; this module only formats what it measured (the dict that
`bench.__main__.run_benchmarks` returns), so either can change without the other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

MEDIAN_S_TARGET = 6.0  # seconds: the median solve time the bench's target asks for


def _procs(n: int) -> str:
    return f"{n} busy process" + ("" if n == 1 else "es")

def recurrent_lines(b: dict[str, Any]) -> list[str]:
    """The printed lines of the recurrent benchmarks."""
    lines = []
    if "recurrent" in b:
        r = b["recurrent"]
        s, ff = r["lstm"], r["feed_forward"]
        stop = r["stop_return"]
        for lr, fr in zip(s["runs"], ff["runs"]):
            lstm = (f"{lr['seconds_to_target']:.1f} s, {lr['env_steps_to_target']:,} env steps"
                    if lr["reached"] else "never")
            lines.append(f"recurrent: seed {lr['seed']}: LSTM to {stop:g}: {lstm}; "
                         f"feed-forward best mean {fr['best_return_mean']}")
        lines.append(f"recurrent: LSTM {s['num_solved']}/{s['num_runs']} seeds reached "
                     f"{stop:g} within {r['max_s']:g} s; seconds median {_sec(s['median_s'])}, "
                     f"worst {_sec(s['max_s'])}; env steps median "
                     f"{_steps(s['median_env_steps'])}, worst {_steps(s['max_env_steps'])}; "
                     f"feed-forward best trailing mean median {ff['median_best_return_mean']}, "
                     f"highest {ff['max_best_return_mean']} ({ff['num_reached']} reached "
                     f"{stop:g})")
    if "actor_forward" in b:
        a = b["actor_forward"]
        lines.append(f"actor forward per env step ({a['num_envs']} envs): MLP "
                     f"{a['mlp_us_per_env_step']:.2f} us, LSTM {a['lstm_us_per_env_step']:.2f} "
                     f"us, LSTM / MLP {a['ratio']} (windows {a['rounds']})")
    if "learner_lstm" in b:
        ll = b["learner_lstm"]
        lines.append(f"learner on {ll['batch_shape']} batches: MLP "
                     f"{ll['mlp_samples_per_s']:,.0f} samples/s, LSTM "
                     f"{ll['lstm_samples_per_s']:,.0f} samples/s, LSTM / MLP {ll['ratio']} "
                     f"(windows {ll['rounds']})")
    return lines


def recurrent_markdown(b: dict[str, Any]) -> list[str]:
    """The memory task's table and the speed rows, for results.md."""
    lines = []
    if "recurrent" in b:
        r = b["recurrent"]
        s, ff = r["lstm"], r["feed_forward"]
        stop, limit = r["stop_return"], r["max_s"]
        lines += ["", f"| StatelessCartPole-v1, {limit:g} s per run | reached {stop:g} | "
                  "median s | worst s | median env steps | worst env steps | best trailing-100 "
                  "mean (median, lowest-highest) |", "| --- | --- | --- | --- | --- | --- | --- |",
                  f"| LSTM (`--use-lstm true`) | {s['num_solved']}/{s['num_runs']} | "
                  f"{_sec(s['median_s'])} | {_sec(s['max_s'])} | "
                  f"{_steps(s['median_env_steps'])} | {_steps(s['max_env_steps'])} | "
                  f"{stop:g} at the stop |",
                  f"| feed-forward (`--use-lstm false`) | {ff['num_reached']}/{len(ff['runs'])} "
                  f"| never | never | never | never | {ff['median_best_return_mean']} "
                  f"({ff['min_best_return_mean']}-{ff['max_best_return_mean']}) |",
                  "", "Seeds, drawn at random for this run: " + ", ".join(map(str, s["seeds"]))
                  + "."]
    rows = []
    if "actor_forward" in b:
        a = b["actor_forward"]
        rows.append(f"| actor forward per env step ({a['num_envs']} envs) | "
                    f"{a['mlp_us_per_env_step']:.2f} us | {a['lstm_us_per_env_step']:.2f} us | "
                    f"{a['ratio']} |")
    if "learner_lstm" in b:
        ll = b["learner_lstm"]
        rows.append(f"| learner samples/s ({ll['batch_shape'][0]} x {ll['batch_shape'][1]} "
                    f"batches) | {ll['mlp_samples_per_s']:,.0f} | "
                    f"{ll['lstm_samples_per_s']:,.0f} | {ll['ratio']} |")
    if rows:
        lines += ["", "| what memory costs | MLP | LSTM | LSTM / MLP |",
                  "| --- | --- | --- | --- |", *rows]
    return lines


def _solve_run_line(r: dict[str, Any]) -> str:
    """One run of the solve check in words."""
    def num(x: Any) -> str:
        return "n/a" if x is None else f"{x:.1f}"

    if r.get("reached", r["solved"]):
        text = (f"seed {r['seed']}: {'solved' if r['solved'] else 'reached 475 too late'} in "
                f"{num(r['seconds_to_target'])} s, {r['env_steps_to_target']:,} env steps")
    else:
        text = (f"seed {r['seed']}: NOT solved (stopped: {r.get('stop_reason')}, mean "
                f"{num(r.get('final_return_mean'))} after {r.get('final_env_steps') or 0:,} "
                "env steps)")
    if r.get("train_after_target") and r.get("reached", r["solved"]):
        text += (f"; lowest mean {num(r.get('return_min_after_target'))} over the "
                 f"{num(r.get('seconds_after_target'))} s after")
    return text + f"; wall {num(r['wall_s'])} s"


def format_table(results: dict[str, Any]) -> str:
    """The printed table: every target, then the raw figures."""
    m = results["machine"]
    lines = [f"machine: {m['nproc']} CPUs ({m['cpu_model']}), python {m['python']}, "
             f"TensorFlow {m['tensorflow']}, load at start {m['loadavg_at_start'][0]:.2f}"
             + ("  [--quick]" if results.get("quick") else ""), ""]
    w = max([58, *(len(t["name"]) for t in results["targets"])])
    lines.append(f"{'target':{w}} {'measured':>10} {'goal':>10}  result")
    for t in results["targets"]:
        v = t["value"]
        shown = "n/a" if v is None else f"{v:.3f}" if abs(v) < 10 else f"{v:,.1f}"
        lines.append(f"{t['name']:{w}} {shown:>10} {t['op'] + ' ' + format(t['target'], 'g'):>10}"
                     f"  {'PASS' if t['passed'] else 'FAIL'}")
    b = results["benchmarks"]
    lines.append("")
    if "sampling" in b:
        s = b["sampling"]
        lines.append(f"sampling: ceiling {s['ceiling']['env_steps_per_s']:,.0f} env steps/s, "
                     f"end to end {s['end_to_end']['env_steps_per_s']:,.0f} env steps/s "
                     f"(trained {s['end_to_end']['trained_per_s']:,.0f}/s); medians of "
                     f"{len(s['round_ratios'])} alternating windows, ratios {s['round_ratios']}")
    for key in ("learner", "learner_sgd4"):
        if key in b:
            ll = b[key]
            lines.append(f"{key}: num_sgd_iter={ll['fed']['num_sgd_iter']}: ceiling "
                         f"{ll['ceiling']['samples_per_s']:,.0f} samples/s "
                         f"({ll['ceiling']['step_ms']:.2f} ms/step, batch "
                         f"{ll['ceiling']['batch_shape']}), fed "
                         f"{ll['fed']['trained_per_s']:,.0f} samples/s, ratio {ll['ratio']} "
                         f"(windows {ll['round_ratios']})")
    for key in ("solve", "solve_loaded"):
        if key in b:
            lines += solve_lines(key, b[key])
    if "dashboard" in b:
        dd = b["dashboard"]
        lines.append(f"dashboard: without {dd['without']:,.0f}, with {dd['with']:,.0f} env "
                     f"steps/s, ratio {dd['ratio']} (95 % {dd['ratio_ci95']})")
    if "memory" in b:
        mm = b["memory"]
        lines.append(f"memory: peak total {mm['peak_total_mb']} MB (driver "
                     f"{mm['driver_peak_mb']} MB, {mm['num_actors']} actors, largest "
                     f"{mm['actor_peak_mb']} MB)")
    if "scaling" in b:
        lines.append(f"{'workers':>8} {'sampling env steps/s':>22} {'end-to-end env steps/s':>24}"
                     f" {'trained/s':>10}")
        for r in b["scaling"]:
            def f(x: Any) -> str:
                return "n/a" if x is None else f"{x:,.0f}"
            lines.append(f"{r['num_workers']:>8} {f(r['sampling_env_steps_per_s']):>22} "
                         f"{f(r['end_to_end_env_steps_per_s']):>24} "
                         f"{f(r['end_to_end_trained_per_s']):>10}")
    lines += recurrent_lines(b)
    for name, err in results["errors"].items():
        lines.append(f"ERROR in {name}: {err}")
    lines.append(f"\ntotal {results['total_s']} s; "
                 f"{'all targets met' if results['all_passed'] else 'NOT all targets met'}")
    return "\n".join(lines)


def _sec(x: float | None) -> str:
    return "never" if x is None else f"{x:.1f} s"


def _steps(x: int | None) -> str:
    return "never" if x is None else f"{x:,}"


def solve_lines(key: str, s: dict[str, Any]) -> list[str]:
    """The printed lines of a solve check: each seed, then the summary."""
    head = key + (f" ({_procs(s['load_procs'])} beside)" if s.get("load_procs") else "")
    lines = [f"{head}: {_solve_run_line(r)}" for r in s["runs"]]
    text = (f"{head}: {s['num_solved']}/{s['num_runs']} seeds reached 475 within "
            f"{s['solve_limit_s']:g} s of process start; seconds median "
            f"{_sec(s['median_s'])}, worst {_sec(s['max_s'])}, best {_sec(s['min_s'])}; env "
            f"steps median {_steps(s['median_env_steps'])}, worst {_steps(s['max_env_steps'])}"
            " ('never': a seed did not reach 475 within its cap, "
            f"{s['max_seconds']:g} s of training)")
    if s.get("after_s"):
        low = s["lowest_after_target"]
        text += (f"; {s['num_stayed']}/{s['num_solved']} solved seeds stayed >= "
                 f"{s['stay_floor']:g} for {s['after_s']:g} s after 475 (lowest mean "
                 f"{'n/a' if low is None else low})")
    return [*lines, text]


def solve_markdown(b: dict[str, Any]) -> list[str]:
    """The solve checks' table (idle, and loaded if run) and the seeds, for results.md."""
    rows = [b[key] for key in ("solve", "solve_loaded") if key in b and "solve_rate" in b[key]]
    if not rows:
        return []
    first = rows[0]
    lines = ["", f"| time to solve CartPole-v1 (475) | within {first['solve_limit_s']:g} s | "
             "median | worst | median env steps | worst env steps | stayed >= "
             f"{first['stay_floor']:g} after |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for s in rows:
        name = (f"{_procs(s['load_procs'])} beside" if s.get("load_procs")
                else "machine otherwise idle")
        stayed = (f"{s['num_stayed']}/{s['num_solved']} for {s['after_s']:g} s"
                  if s.get("after_s") else "not measured")
        lines.append(f"| {name} | {s['num_solved']}/{s['num_runs']} | {_sec(s['median_s'])} | "
                     f"{_sec(s['max_s'])} | {_steps(s['median_env_steps'])} | "
                     f"{_steps(s['max_env_steps'])} | {stayed} |")
    lines += ["", "Seeds, drawn at random for this run: "
              + ", ".join(map(str, first["seeds"])) + "."]
    return lines


def format_markdown(results: dict[str, Any]) -> str:
    """The README's Performance table: every target, then the scaling rows."""
    def num(v: Any, unit: str = "") -> str:
        if v is None:
            return "n/a"
        text = f"{v:.3f}" if abs(v) < 10 else f"{v:,.1f}" if abs(v) < 1000 else f"{v:,.0f}"
        return text + (f" {unit}" if unit else "")

    lines = ["| target | measured | goal | result |", "| --- | --- | --- | --- |"]
    for t in results["targets"]:
        goal = f"{t['op']} {t['target']:g}" + (f" {t['unit']}" if t["unit"] else "")
        lines.append(f"| {t['name']} | {num(t['value'], t['unit'])} | {goal} | "
                     f"{'met' if t['passed'] else 'MISSED'} |")
    lines += solve_markdown(results["benchmarks"])
    lines += recurrent_markdown(results["benchmarks"])
    rows = results["benchmarks"].get("scaling")
    if rows:
        lines += ["", "| process workers (x 8 envs) | sampling only, env steps/s | "
                  "end to end, env steps/s |", "| --- | --- | --- |"]
        lines += [f"| {r['num_workers']} | {num(r['sampling_env_steps_per_s'])} | "
                  f"{num(r['end_to_end_env_steps_per_s'])} |" for r in rows]
    return "\n".join(lines)


def plot_solves(ax: Any, b: dict[str, Any]) -> None:
    """Seconds to 475 per seed: solved (filled), reached after the limit (hollow), never
    reached (x at the wall time); idle and loaded side by side."""
    solve = b.get("solve") or b.get("solve_loaded")
    limit = (solve or {}).get("solve_limit_s") or 60.0
    seeds: list[int] = []
    for key, off, color, label in (("solve", -0.15, "tab:green", "idle"),
                                   ("solve_loaded", 0.15, "tab:purple", "loaded")):
        s = b.get(key)
        if not s:
            continue
        if not seeds:
            seeds = [r["seed"] for r in s["runs"]]
        pts: dict[str, list[tuple[float, float]]] = {"solved": [], "late": [], "never": []}
        for r in s["runs"]:
            x = (seeds.index(r["seed"]) if r["seed"] in seeds else len(seeds)) + off
            if r["solved"]:
                pts["solved"].append((x, r["seconds_to_target"]))
            elif r.get("reached"):  # reached 475, after the limit
                pts["late"].append((x, r["seconds_to_target"]))
            else:
                pts["never"].append((x, r["wall_s"]))
        for kind, marker, mfc, mec, text in (
                ("solved", "o", color, color, "solved"),
                ("late", "o", "none", color, "after the limit"),
                ("never", "x", "tab:red", "tab:red", "never (at its wall s)")):
            if pts[kind]:
                ax.plot(*zip(*pts[kind]), marker, ms=8, ls="none", mfc=mfc, mec=mec,
                        label=f"{label}: {text}")
        if s.get("median_s") is not None:
            ax.axhline(s["median_s"], color=color, ls="--", lw=1, label=f"{label}: median")
    if seeds:
        ax.set_xticks(range(len(seeds)), [str(x) for x in seeds],
                      rotation=90 if len(seeds) > 6 else 0, fontsize=8)
    ax.axhline(limit, color="gray", ls=":", label=f"limit {limit:g} s")
    ax.axhline(MEDIAN_S_TARGET, color="gray", ls="-.", label=f"median target {MEDIAN_S_TARGET:g} s")
    ax.set_xlabel("seed (drawn at random)")
    ax.set_ylabel("seconds from process start to mean 475")
    ax.set_title("time to solve CartPole-v1")
    ax.legend(fontsize=7)


def plot(results: dict[str, Any], path: Path) -> Path:
    """results.png: scaling bars, time-to-solve points, ratios against their targets."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    b = results["benchmarks"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax = axes[0]
    rows = b.get("scaling", [])
    if rows:
        xs = range(len(rows))
        for off, key, label in ((-0.2, "sampling_env_steps_per_s", "sampling only"),
                                (0.2, "end_to_end_env_steps_per_s", "end to end")):
            ax.bar([x + off for x in xs], [r[key] or 0 for r in rows], width=0.4, label=label)
        ax.set_xticks(list(xs), [str(r["num_workers"]) for r in rows])
        ax.legend()
    ax.set_xlabel("process workers (x 8 envs)")
    ax.set_ylabel("env steps / s")
    ax.set_title(f"scaling on {results['machine']['nproc']} cores")

    ax = axes[1]
    plot_solves(ax, b)

    ax = axes[2]
    # Each target as measured / goal for ">=" and goal / measured for "<=": >= 1 passes.
    labels, values, colors = [], [], []
    for t in results["targets"]:
        v = t["value"]
        if v is None or not v:
            continue
        score = v / t["target"] if t["op"] == ">=" else t["target"] / v
        labels.append(t.get("short") or t["name"].split(":")[0]
                      + ("" if "actor" not in t["name"] else " (actor)"))
        values.append(score)
        colors.append("tab:green" if t["passed"] else "tab:red")
    ax.barh(range(len(values)), values, color=colors)
    ax.set_yticks(range(len(values)), labels)
    ax.axvline(1.0, color="k", ls="--")
    ax.set_xlabel("measured vs target (>= 1 meets it)")
    ax.set_title("targets")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
