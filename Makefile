# Two commands on a fresh machine: `make demo` (the main job) and `make test` (the suite).
# Both create .venv themselves. torch is installed first and pinned: an unpinned torch
# pulls a multi-GB CUDA build.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
TORCH   := torch==2.13.0

.PHONY: venv demo paper test lint sim bench clean system-deps

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e '.[gpu,cpu,plots,service,ray,verl,clients,dev]' $(TORCH)
	# mini-swe-agent's own dependencies (litellm, ...) are not needed to drive its agent class
	$(BIN)/pip install -q --no-deps mini-swe-agent==2.4.6
	touch $(STAMP)

venv: $(STAMP)

# Debian packages: bubblewrap for the CPU manager's sandboxes, gcc/g++ for the SandboxFusion
# face's C and C++ runs; skipped when already present.
system-deps:
	@command -v bwrap >/dev/null 2>&1 && command -v gcc >/dev/null 2>&1 && command -v g++ >/dev/null 2>&1 \
	  || (apt-get update -qq && apt-get install -y -qq bubblewrap gcc g++)

# The main job: real rollout-shaped workloads through ARL-Tangram and the baselines, side by side.
demo: $(STAMP) system-deps
	$(BIN)/arl-tangram bench live --quick --report-dir reports/live

# The simulated paper reproduction (paper-scale clusters on a virtual clock).
paper: $(STAMP)
	$(BIN)/arl-tangram sim paper --report-dir reports/paper

test: $(STAMP) system-deps
	$(BIN)/ruff check src tests
	$(BIN)/mypy
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check src tests
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/arl-tangram bench scheduler

clean:
	rm -rf $(VENV) reports build *.egg-info
