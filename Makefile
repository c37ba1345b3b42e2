# impala_lab's everyday commands. On a fresh machine with Python >= 3.11 and make, `make demo`
# and `make test` work as the very first commands: each creates .venv (or reuses it) and
# installs what it needs once; a stamp file re-runs the install only when pyproject.toml (or the
# grader's, grader/pyproject.toml) changes.

SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3 2>/dev/null)
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
PIP_INSTALL := $(PIP) install --progress-bar off
# Playwright drives Debian's /usr/bin/chromium; it must never download a browser of its own.
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD := 1
export PIP_DISABLE_PIP_VERSION_CHECK := 1

BASE_STAMP := $(VENV)/.installed-base
DEV_STAMP := $(VENV)/.installed-dev

.PHONY: help setup demo test test-oldest lab docs docs-instructor bench bench-peers nbstrip browser-deps grader-deps mujoco-deps clean

help:
	@echo "make demo          set up .venv and train CartPole-v1 to a mean return of 475 (5 min at most)"
	@echo "make test          set up .venv (with the dev and ray extras), then ruff and pytest (2 workers)"
	@echo "make test-oldest   the fast tests against the oldest declared versions (own venv, .venv-oldest)"
	@echo "make lab           JupyterLab on 127.0.0.1 in notebooks/"
	@echo "make docs          the course website in site/ (notebooks executed in fast mode, or reused)"
	@echo "make docs-instructor  the same with the instructor guide, its answers and the solutions, in site-instructor/"
	@echo "make tensorboard   TensorBoard on 127.0.0.1:6006 over runs/ (LOGDIR=..., TENSORBOARD_PORT=...)"
	@echo "make bench         python -m bench"
	@echo "make bench-peers   impala_lab against SB3 PPO on random seeds, CartPole, Pendulum, MuJoCo (own venv)"
	@echo "make nbstrip       strip outputs from notebooks/ (they are committed without them)"
	@echo "make setup         only create .venv and install .[dev,ray] and the grader (grader/)"
	@echo "make browser-deps  install Debian's chromium for the browser tests (as root)"
	@echo "make grader-deps   install bubblewrap, the exercise grader's sandbox (as root)"
	@echo "make mujoco-deps   install Mesa's EGL, for MuJoCo's frames without a display (as root)"
	@echo "make clean         remove .venv, caches and test artifacts (keeps runs/)"

$(BIN)/python:
	@if [ -z "$(PYTHON)" ]; then \
	  echo "make: no python3.11 or python3 on PATH; install Python >= 3.11," \
	       "or run make PYTHON=/path/to/python3.11" >&2; exit 1; fi
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { \
	  echo "make: impala_lab needs Python >= 3.11, but $(PYTHON) is" \
	       "$$($(PYTHON) -c 'import platform; print(platform.python_version())');" \
	       "install Python 3.11 or run make PYTHON=/path/to/python3.11" >&2; exit 1; }
	@echo "creating $(VENV) with $(PYTHON) ($$($(PYTHON) --version 2>&1))"
	@$(PYTHON) -m venv $(VENV) || { rm -rf $(VENV); \
	  echo "make: '$(PYTHON) -m venv' failed; on Debian/Ubuntu install the python3-venv" \
	       "package (e.g. apt-get install python3.11-venv)" >&2; exit 1; }
	@$(PIP_INSTALL) --quiet --upgrade pip

# Order-only on the interpreter: a venv that exists is reused, never rebuilt.
$(BASE_STAMP): pyproject.toml | $(BIN)/python
	@echo "installing impala_lab into $(VENV) (the first time takes a few minutes)"
	$(PIP_INSTALL) -e .
	@touch $@

# The instructors' grader (its own package in grader/) comes with the dev install.
$(DEV_STAMP): pyproject.toml grader/pyproject.toml | $(BIN)/python
	@echo "installing impala_lab[dev,ray] and impala_lab_grader into $(VENV) (the first time takes a few minutes)"
	$(PIP_INSTALL) -e '.[dev,ray]'
	$(PIP_INSTALL) -e ./grader
	@touch $@ $(BASE_STAMP)

setup: $(DEV_STAMP)

demo: $(BASE_STAMP)
	$(BIN)/impala-lab train --env CartPole-v1 --stop-return 475 --max-seconds 300 --out runs/demo --overwrite

# Two pytest workers: most of the suite's time is spent waiting on child processes (a worker's
# start, TensorFlow's import, a kernel, a Ray node), which a second worker overlaps even on two
# cores (on this 2-core machine: 706 s against 1,365 s in one process). TEST_WORKERS=0 runs
# it in one process.
TEST_WORKERS ?= 2

test: browser-deps grader-deps mujoco-deps $(DEV_STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

# Optional, not part of `make test`: installs each requirement at its lower bound in
# pyproject.toml into .venv-oldest and runs pytest -m "not slow" there (.ci/test-oldest).
test-oldest:
	PYTHON=$(PYTHON) VENV_OLDEST=.venv-oldest bash .ci/test-oldest $(PYTEST_ARGS)

lab: $(DEV_STAMP)
	$(BIN)/jupyter lab --ip=127.0.0.1 --ServerApp.root_dir=notebooks \
	  $$([ "$$(id -u)" = 0 ] && echo --allow-root)

# The course website: README, docs/*.md, the lecture notebooks and exercises executed in fast mode
# (copies that tests/test_notebooks.py left in test-artifacts/ are reused), the config table and
# the API reference, built with `mkdocs build --strict` into site/.
docs: $(DEV_STAMP)
	$(BIN)/python tools/build_site.py

# The instructor's site: the students' one plus the instructor guide (the answers), the grader's
# guide and the exercises' solutions, in site-instructor/. Keep it off the students' server.
docs-instructor: $(DEV_STAMP)
	$(BIN)/python tools/build_site.py --instructor

# The summaries of every run trained with `impala-lab train --tensorboard` (runs/NAME/tensorboard).
LOGDIR ?= runs
TENSORBOARD_PORT ?= 6006
.PHONY: tensorboard
tensorboard: $(BASE_STAMP)
	$(BIN)/tensorboard --logdir $(LOGDIR) --host 127.0.0.1 --port $(TENSORBOARD_PORT)

bench: $(BASE_STAMP)
	$(BIN)/python -m bench

# Optional, not part of `make test`: builds bench/.peers-venv (stable-baselines3 and torch from
# PyPI, a few GB; rebuilt when bench/peers.py's pins change) and writes docs/results/peers_*.
# The MuJoCo part gives each of 2 systems x 2 envs x 3 seeds a 20-minute budget: about 4 hours
# (PEERS_MUJOCO_ARGS="--budget 300" for a shorter look).
bench-peers: $(BASE_STAMP)
	$(BIN)/python -m bench.peers $(PEERS_ARGS)
	$(BIN)/python -m bench.peers_pendulum
	$(BIN)/python -m bench.peers_mujoco $(PEERS_MUJOCO_ARGS)

# Standard library only: works before .venv exists.
nbstrip:
	$(PYTHON) tools/nbstrip.py notebooks

# The browser tests launch Debian's Chromium (Playwright's own download cannot be used).
browser-deps:
	@if [ -x /usr/bin/chromium ]; then \
	  echo "browser-deps: /usr/bin/chromium is there"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "browser-deps: installing Debian's chromium (about a minute)"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -qq && apt-get install -y -qq chromium >/dev/null; \
	  test -x /usr/bin/chromium || { echo "browser-deps: chromium did not install" >&2; exit 1; }; \
	else \
	  echo "browser-deps: /usr/bin/chromium is missing and this is not root with apt-get;" \
	       "skipping (install Debian's chromium to run the browser tests)"; \
	fi

# The instructors' grader (python -m impala_lab_grader) runs each hand-in in a bubblewrap sandbox;
# without it, it grades nothing unless told --unsandboxed (tests/test_grader_attacks.py then
# skips the tests that need the sandbox).
grader-deps:
	@if command -v bwrap >/dev/null; then \
	  echo "grader-deps: bwrap is there"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "grader-deps: installing Debian's bubblewrap"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null; \
	  command -v bwrap >/dev/null || { echo "grader-deps: bubblewrap did not install" >&2; exit 1; }; \
	else \
	  echo "grader-deps: bwrap is missing and this is not root with apt-get; skipping" \
	       "(the grader refuses to grade without it; install bubblewrap)"; \
	fi

# MuJoCo's envs (the mujoco extra, in dev) render rgb_array frames through OpenGL; without a
# display impala_lab.cli.play picks EGL, which Mesa provides in software (no GPU needed):
# libEGL and libOpenGL (glvnd), Mesa's EGL vendor library and its software (llvmpipe) driver.
MUJOCO_GL_PACKAGES := libegl1 libopengl0 libegl-mesa0 libgl1-mesa-dri
mujoco-deps:
	@missing=$$(for p in $(MUJOCO_GL_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || echo $$p; done); \
	if [ -z "$$missing" ]; then \
	  echo "mujoco-deps: Mesa's EGL is there"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "mujoco-deps: installing Debian's" $$missing; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -qq && apt-get install -y -qq $$missing >/dev/null; \
	else \
	  echo "mujoco-deps: missing" $$missing "and this is not root with apt-get; skipping" \
	       "(MuJoCo envs train, but their frames need EGL or OSMesa without a display)"; \
	fi

clean:
	rm -rf $(VENV) .venv-oldest .pytest_cache .ruff_cache .hypothesis test-artifacts bench/out *.egg-info \
	  site site-instructor build/site-src build/site-src-instructor build/mkdocs.yml \
	  build/mkdocs-instructor.yml
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
