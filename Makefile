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
# face's C and C++ runs, and the image tools (skopeo, umoci, docker-registry for a loopback
# registry in tests, mmdebstrap for the benchmark's cached base, zstd for zstd layers);
# skipped when all are present.
SYSTEM_TOOLS := bwrap gcc g++ skopeo umoci docker-registry mmdebstrap zstd
SYSTEM_PKGS  := bubblewrap gcc g++ skopeo umoci docker-registry mmdebstrap zstd
system-deps:
	@missing=; for t in $(SYSTEM_TOOLS); do command -v $$t >/dev/null 2>&1 || missing=1; done; \
	  [ -z "$$missing" ] || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(SYSTEM_PKGS))

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
