"""The set-up files agree with each other: pyproject.toml, environment.yml, Makefile, .ci/run."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tomllib
from collections import Counter
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
TF_DISTRIBUTIONS = {"tensorflow", "tensorflow-cpu"}

# marker environments of the platforms TensorFlow ships wheels for
PLATFORMS = {
    "linux-x86_64": ({"sys_platform": "linux", "platform_machine": "x86_64"}, "tensorflow-cpu"),
    "windows-amd64": ({"sys_platform": "win32", "platform_machine": "AMD64"}, "tensorflow-cpu"),
    "macos-arm64": ({"sys_platform": "darwin", "platform_machine": "arm64"}, "tensorflow"),
    "macos-x86_64": ({"sys_platform": "darwin", "platform_machine": "x86_64"}, "tensorflow"),
    "linux-aarch64": ({"sys_platform": "linux", "platform_machine": "aarch64"}, "tensorflow"),
}


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _environment() -> dict:
    return yaml.safe_load((ROOT / "environment.yml").read_text())


def _env_pip_section() -> list[str]:
    sections = [d["pip"] for d in _environment()["dependencies"] if isinstance(d, dict)]
    assert len(sections) == 1, "environment.yml needs exactly one `pip:` section"
    return sections[0]


def _key(req: Requirement) -> tuple:
    """What must agree between the two files: name, extras, version range and marker."""
    return (canonicalize_name(req.name), tuple(sorted(req.extras)),
            tuple(sorted(str(s) for s in req.specifier)), str(req.marker or ""))


def _pyproject_requirements() -> list[Requirement]:
    project = _pyproject()["project"]
    lines = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        lines += extra
    return [Requirement(line) for line in lines]


def _environment_requirements() -> list[Requirement]:
    return [Requirement(line) for line in _env_pip_section() if not line.startswith("-")]


def test_pyproject_declares_package_script_and_python() -> None:
    data = _pyproject()
    project = data["project"]
    assert project["name"] == "impala_lab"
    assert project["requires-python"] == ">=3.11"
    assert project["scripts"] == {"impala-lab": "impala_lab.cli.main:main"}
    assert data["tool"]["setuptools"]["packages"]["find"]["include"] == ["impala_lab*"]
    assert set(project["optional-dependencies"]) == {"ray", "dev", "minatar", "mujoco", "atari"}
    # dev installs every extra's requirements but ray's (make test adds ray): the mujoco and
    # atari tests run wherever dev is installed
    mujoco = {canonicalize_name(Requirement(r).name)
              for r in project["optional-dependencies"]["mujoco"]}
    assert mujoco == {"mujoco", "imageio", "packaging"}
    dev = {canonicalize_name(Requirement(r).name): Requirement(r)
           for r in project["optional-dependencies"]["dev"]}
    assert {"pytest", "pytest-timeout", "pytest-xdist", "ruff", "hypothesis", "nbclient",
            "nbformat", "ipykernel", "jupyterlab", "playwright", "voila"} <= set(dev)
    assert str(dev["playwright"].specifier) == "==1.65.*"
    atari = {canonicalize_name(Requirement(r).name)
             for r in project["optional-dependencies"]["atari"]}
    assert atari == {"ale-py", "opencv-python-headless"}
    assert mujoco <= set(dev) and atari <= set(dev) and "minatar" in dev
    pytest_cfg = data["tool"]["pytest"]["ini_options"]
    assert pytest_cfg["testpaths"] == ["tests"]
    assert pytest_cfg["timeout"] == 300
    assert "-ra" in pytest_cfg["addopts"].split()
    ruff = data["tool"]["ruff"]
    assert (ruff["line-length"], ruff["target-version"]) == (100, "py311")


def test_environment_yml_carries_the_same_requirements_as_pyproject() -> None:
    env = _environment()
    assert env["name"] == "impala-lab"
    conda = [d for d in env["dependencies"] if isinstance(d, str)]
    assert sorted(conda) == ["pip", "python=3.11"]

    ours = Counter(_key(r) for r in _pyproject_requirements())
    theirs = Counter(_key(r) for r in _environment_requirements())
    only_pyproject = sorted((ours - theirs).elements())
    only_env = sorted((theirs - ours).elements())
    assert not only_pyproject and not only_env, (
        f"pyproject.toml and environment.yml disagree; only in pyproject.toml: {only_pyproject}; "
        f"only in environment.yml: {only_env}")

    editable = [line for line in _env_pip_section() if line.startswith("-")]
    assert editable == ["-e .[dev,ray]"]
    extras = set(editable[0].split("[", 1)[1].rstrip("]").split(","))
    assert extras <= set(_pyproject()["project"]["optional-dependencies"])


@pytest.mark.parametrize("source", ["pyproject.toml", "environment.yml"])
@pytest.mark.parametrize("platform", sorted(PLATFORMS))
def test_each_platform_gets_exactly_one_tensorflow(source: str, platform: str) -> None:
    reqs = _pyproject_requirements() if source == "pyproject.toml" else _environment_requirements()
    tf = [r for r in reqs if canonicalize_name(r.name) in TF_DISTRIBUTIONS]
    assert len(tf) == 2
    env, expected = PLATFORMS[platform]
    chosen = [r for r in tf if r.marker is None or r.marker.evaluate(env)]
    assert [canonicalize_name(r.name) for r in chosen] == [expected]
    assert str(chosen[0].specifier) == ">=2.16.1"  # Keras 3; 2.16.0 was never released


def test_tensorflow_markers_are_complements() -> None:
    cpu, full = (next(r for r in _pyproject_requirements() if canonicalize_name(r.name) == n)
                 for n in ("tensorflow-cpu", "tensorflow"))
    # every combination of the two variables the markers read: exactly one applies
    for sys_platform in ("linux", "win32", "darwin", "freebsd"):
        for machine in ("x86_64", "AMD64", "arm64", "aarch64", "ppc64le"):
            env = {"sys_platform": sys_platform, "platform_machine": machine}
            assert cpu.marker.evaluate(env) != full.marker.evaluate(env), env


def _make(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), *args],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env})


def test_make_targets_run_the_documented_commands(tmp_path: Path) -> None:
    # -n prints the recipes without running them; a venv path outside the repo makes every
    # set-up step show up, as on a fresh clone.
    venv = f"VENV={tmp_path}/venv"
    demo = _make("-n", venv, "demo")
    assert demo.returncode == 0, demo.stderr
    assert f"{tmp_path}/venv/bin/impala-lab train --env CartPole-v1 --stop-return 475 " \
           "--max-seconds 300 --out runs/demo" in demo.stdout
    assert "-m venv" in demo.stdout and "install --progress-bar off -e ." in demo.stdout

    test = _make("-n", venv, "test")
    assert test.returncode == 0, test.stderr
    lines = test.stdout.splitlines()
    install = next(i for i, line in enumerate(lines) if "-e '.[dev,ray]'" in line)
    grader = next(i for i, line in enumerate(lines) if line.endswith("install --progress-bar "
                                                                    "off -e ./grader"))
    ruff = lines.index(f"{tmp_path}/venv/bin/ruff check .")
    pytest_line = lines.index(f"{tmp_path}/venv/bin/python -m pytest -n 2 --dist worksteal ")
    assert install < grader < ruff < pytest_line
    one = _make("-n", venv, "TEST_WORKERS=0", "PYTEST_ARGS=-k vtrace", "test").stdout.splitlines()
    assert f"{tmp_path}/venv/bin/python -m pytest -n 0 --dist worksteal -k vtrace" in one
    assert "apt-get install" in test.stdout  # browser-deps runs first
    assert "mujoco-deps:" in test.stdout  # and mujoco-deps: EGL for MuJoCo's frames

    lab = _make("-n", venv, "lab")
    assert "jupyter lab --ip=127.0.0.1 --ServerApp.root_dir=notebooks" in lab.stdout
    assert f"{tmp_path}/venv/bin/python -m bench" in _make("-n", venv, "bench").stdout
    docs = _make("-n", venv, "docs")
    assert docs.returncode == 0, docs.stderr
    assert "install --progress-bar off -e '.[dev,ray]'" in docs.stdout  # mkdocs is in dev
    assert f"{tmp_path}/venv/bin/python tools/build_site.py" in docs.stdout


def test_make_recipes_never_let_playwright_download_a_browser() -> None:
    out = _make("-s", "--eval", "show-env: ; @echo skip=$$PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD",
                "show-env", PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD="0")
    assert out.stdout.strip() == "skip=1", out.stderr


def test_make_refuses_python_older_than_311(tmp_path: Path) -> None:
    fake = tmp_path / "python3"
    fake.write_text('#!/bin/sh\ncase "$2" in *platform*) echo 3.10.12;; *) exit 1;; esac\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    out = _make(f"VENV={tmp_path}/venv", f"PYTHON={fake}", "setup")
    assert out.returncode != 0
    assert f"impala_lab needs Python >= 3.11, but {fake} is 3.10.12" in out.stderr
    assert "make PYTHON=/path/to/python3.11" in out.stderr
    assert not (tmp_path / "venv").exists()


def test_make_says_when_there_is_no_python(tmp_path: Path) -> None:
    out = _make(f"VENV={tmp_path}/venv", "PYTHON=", "setup")
    assert out.returncode != 0
    assert "no python3.11 or python3 on PATH" in out.stderr


def test_ci_runs_the_readme_test_command() -> None:
    script = (ROOT / ".ci" / "run").read_text()
    assert subprocess.run(["bash", "-n", str(ROOT / ".ci" / "run")]).returncode == 0
    assert "set -euo pipefail" in script
    commands = [line.strip() for line in script.splitlines()]
    assert "make test" in commands
    assert "make test" in (ROOT / "README.md").read_text()


def test_gitignore_keeps_outputs_out_but_bench_results_in() -> None:
    for path in (".venv/bin/python", ".venv-oldest/bin/python", "runs/demo/x",
                 "test-artifacts/shot.png", "bench/out/x", "impala_lab/__pycache__/x.pyc",
                 "impala_lab.egg-info/PKG-INFO", "site/index.html", "build/site-src/README.md"):
        out = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "--no-index", "-q", path])
        assert out.returncode == 0, f"{path} should be ignored"
    for path in ("docs/results/results.json", "impala_lab/config.py", "notebooks/01.ipynb",
                 "docs/training.md", "mkdocs.yml", "tools/build_site.py"):
        out = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "--no-index", "-q", path])
        assert out.returncode == 1, f"{path} should not be ignored"


# The top level of the repository as the README shows it. A folder a test run left in the
# working directory (a fuzz run once committed four run folders named "nan", "0", ...) fails.
TOP_LEVEL = {".ci", ".gitignore", "LICENSE", "MANIFEST.in", "Makefile", "NOTICE", "README.md",
             "bench", "docs", "environment.yml", "examples", "grader", "impala_lab",
             "mkdocs.yml", "notebooks", "pyproject.toml", "setup.py", "tests", "tools"}


def test_the_repository_tracks_nothing_at_its_top_level_but_the_known_entries() -> None:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout (an installed copy): there is no tracked tree")
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True,
                         check=True).stdout
    top = {line.split("/", 1)[0] for line in out.splitlines() if line}
    assert top - TOP_LEVEL == set(), "tracked entries the house does not know (remove them)"
    assert TOP_LEVEL - top == set(), "known entries missing from the repository"


def test_the_oldest_run_pins_each_declared_lower_bound() -> None:
    # `make test-oldest` installs what tools/oldest_constraints.py prints: it must be exactly
    # pyproject.toml's lower bounds (read here with packaging), or the run tests other versions
    # than the ones the project claims to support.
    extras = list(_pyproject()["project"]["optional-dependencies"])
    script = (ROOT / ".ci" / "test-oldest").read_text()
    assert f"EXTRAS=({' '.join(sorted(extras))})" in script
    assert "tools/oldest_constraints.py" in script and '--constraint "$constraints"' in script
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "oldest_constraints.py"), *extras],
                         capture_output=True, text=True, check=True).stdout
    pins = Counter((canonicalize_name(r.name), str(r.specifier), str(r.marker or ""))
                   for r in map(Requirement, out.splitlines()))
    expected = Counter()
    for req in _pyproject_requirements():
        lower = [spec.version for spec in req.specifier if spec.operator == ">="]
        if lower:
            expected[(canonicalize_name(req.name), f"=={lower[0]}", str(req.marker or ""))] += 1
    assert pins == expected
    # every runtime dependency has a lower bound, so none floats to its newest in the oldest run
    runtime = _pyproject()["project"]["dependencies"]
    assert {canonicalize_name(Requirement(r).name) for r in runtime} <= {n for n, _, _ in pins}


def test_make_test_oldest_runs_the_fast_tests_in_its_own_venv(tmp_path: Path) -> None:
    oldest = _make("-n", f"VENV={tmp_path}/venv", "test-oldest")
    assert oldest.returncode == 0, oldest.stderr
    assert "VENV_OLDEST=.venv-oldest bash .ci/test-oldest" in oldest.stdout
    assert "test-oldest" not in _make("-n", f"VENV={tmp_path}/venv", "test").stdout
    assert '-m pytest -m "not slow"' in (ROOT / ".ci" / "test-oldest").read_text()
    assert ".venv-oldest" in _make("-n", "clean").stdout
