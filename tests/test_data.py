"""The recorded runs in impala_lab/data load, ship in the wheel, and hold what notebook 06 says.

Notebook 06's section "When learning collapses" replays collapse_cartpole_metrics.csv; these
tests pin the moments it names (the fall at about 24 s, the deterministic policy after it,
the health monitor's flags at the fall), so a new recording or a new threshold that moves
them fails here, with the notebook's text to update.
"""

from __future__ import annotations

import csv
import fnmatch
import importlib.util
import json
import math
import shutil
import subprocess
import sys
import tomllib
import zipfile
from importlib.resources import files
from pathlib import Path

import numpy as np
import pytest

from impala_lab.config import ImpalaConfig
from impala_lab.driver.health import HealthMonitor, flag_codes

ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = ROOT / "impala_lab" / "data"
DATA = files("impala_lab") / "data"
NOTEBOOK = ROOT / "notebooks" / "06_learner_thread.ipynb"
PLOTTED = ("time_total_s", "episode_return_mean", "episode_return_count", "learner.entropy",
           "learner.vf_loss", "learner.grad_gnorm", "learner.policy_version")


def read_metrics(name: str) -> dict[str, np.ndarray]:
    """As the notebook reads it: numeric columns as float arrays, empty cells as nan."""
    with (DATA / name).open(newline="") as f:
        rows = list(csv.DictReader(f))
    columns = {}
    for key in rows[0]:
        try:
            columns[key] = np.array([float(r[key]) if r[key] else np.nan for r in rows])
        except ValueError:
            continue
    return columns


def fall_index(run: dict[str, np.ndarray]) -> int | None:
    """The notebook's rule: the first row below 20 after the return had been above 200."""
    ret = run["episode_return_mean"]
    fell = (np.maximum.accumulate(ret) > 200) & (ret < 20)
    return int(np.argmax(fell)) if fell.any() else None


def notebook_text() -> str:
    nb = json.loads(NOTEBOOK.read_text(encoding="utf-8"))
    return "\n".join("".join(c["source"]) for c in nb["cells"])


@pytest.fixture(scope="module")
def crash() -> dict[str, np.ndarray]:
    return read_metrics("collapse_cartpole_metrics.csv")


def test_every_data_file_is_package_data_and_documented():
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())[
        "tool"]["setuptools"]["package-data"]["impala_lab"]
    readme = (DATA_DIR / "README.md").read_text()
    data_files = sorted(p.name for p in DATA_DIR.iterdir() if p.suffix in (".csv", ".json"))
    assert "collapse_cartpole_metrics.csv" in data_files
    for name in data_files:
        assert any(fnmatch.fnmatch(f"data/{name}", pat) for pat in patterns), \
            f"{name} would not ship in the wheel: add a pattern to [tool.setuptools.package-data]"
        assert f"`{name}`" in readme, f"impala_lab/data/README.md does not describe {name}"


def test_the_collapse_recording_and_its_config_load(crash):
    for key in PLOTTED:
        assert key in crash, key
    assert len(crash["time_total_s"]) > 60
    assert np.all(np.diff(crash["time_total_s"]) > 0)
    config = json.loads((DATA / "collapse_cartpole_config.json").read_text())
    assert (config["env"], config["seed"], config["opt_type"], config["entropy_coeff"]) == (
        "CartPole-v1", 510687, "adam", 0.0)
    ImpalaConfig.from_dict(config)  # still a config this version can run


def test_the_fall_is_where_notebook_06_says(crash):
    t, ret, entropy = (crash[k] for k in ("time_total_s", "episode_return_mean",
                                          "learner.entropy"))
    i = fall_index(crash)
    assert i is not None and 23 < t[i] < 25
    before = (t >= t[i] - 4) & (t < t[i])
    assert before.sum() >= 3 and np.all(ret[before] > 200)
    after = t >= t[i] + 2
    assert after.sum() > 40
    assert np.all(ret[after] < 20) and np.all(entropy[after] < 1e-3)
    assert entropy[i] < 0.05
    assert np.nanargmax(crash["learner.vf_loss"]) == i
    assert np.nanargmax(crash["learner.grad_gnorm"]) == i
    assert f"It falls at about {round(t[i])} s" in notebook_text()


def test_the_health_monitor_flags_the_fall_in_the_notebooks_replay(crash):
    """The notebook feeds each row as the learner steps of its second (policy_version's rise)."""
    now = [0.0]
    monitor = HealthMonitor(2, 16, clock=lambda: now[0])
    version, codes = 0.0, []
    for k, now[0] in enumerate(crash["time_total_s"]):
        v = crash["learner.policy_version"][k]
        if math.isfinite(v):
            step = {s: crash[f"learner.{s}"][k] for s in ("entropy", "vf_loss", "grad_gnorm")}
            for _ in range(int(v - version)):
                monitor.observe_learner_step(step)
            version = v
        codes.append(flag_codes(monitor.check(
            episode_return_mean=crash["episode_return_mean"][k],
            episode_return_count=int(crash["episode_return_count"][k]))))
    i = fall_index(crash)
    assert "entropy_collapsed" in codes[i]
    # The spikes before and at the fall count once the return has stayed down for
    # SPIKE_CONFIRM_S (10 s): both spike flags within 12 rows of the fall, none before it.
    later = codes[i:i + 12]
    assert any("grad_norm_spike" in c and "value_loss_spike" in c for c in later), later
    assert "entropy_collapsed" not in "".join(codes[:i]) and "spike" not in "".join(codes[:i])
    assert all("entropy_collapsed" in c for c in codes[i + 2:])


def test_a_fixed_recording_if_shipped_does_not_collapse():
    if not (DATA_DIR / "fixed_cartpole_metrics.csv").is_file():
        pytest.skip("no fixed_cartpole_metrics.csv yet: notebook 06 prints a note instead")
    fixed = read_metrics("fixed_cartpole_metrics.csv")
    for key in PLOTTED:
        assert key in fixed, key
    assert fall_index(fixed) is None
    assert np.nanmax(fixed["episode_return_mean"]) > 400


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("wheel") is None, reason="needs the wheel package")
def test_the_wheel_ships_the_recordings(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "impala_lab", src / "impala_lab",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(tmp_path / "dist"), str(src)],
                   check=True, capture_output=True)
    (wheel,) = (tmp_path / "dist").glob("impala_lab-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for path in DATA_DIR.iterdir():
        if path.suffix in (".csv", ".json"):
            assert f"impala_lab/data/{path.name}" in names, path.name
