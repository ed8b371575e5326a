# Two commands do everything on a fresh machine with Python 3.11 and Go:
#   make run    set up, start a local control plane and the seed example on it
#   make test   set up, run the whole test suite against a real control plane
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
BUILD := tools/controlplane/build.sh

.PHONY: all setup venv controlplane run dev demo test test-unit clean

all: test

$(VENV)/.installed: setup.cfg pyproject.toml
	@echo "[setup] creating $(VENV) and installing declop with its test extras"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,fast]'
	@touch $@

venv: $(VENV)/.installed

# Builds kube-apiserver, kube-controller-manager, etcd, kubectl and helm once (10-20 min cold),
# then finds them in ~/.cache/declop/controlplane in a second.
controlplane:
	@$(BUILD) >/dev/null

setup: venv controlplane

# The seed example on a local control plane; in a second terminal:
#   export KUBECONFIG=$$PWD/.declop/kubeconfig PATH=<assets>:$$PATH   (printed at start)
#   kubectl run nginx --image nginx; kubectl label pod nginx env=prod; kubectl delete pod nginx --grace-period=0 --force
run: setup
	DECLOP_ASSETS_DIR=$$($(BUILD) 2>/dev/null) $(VENV)/bin/declop dev examples/pods.py

# Only the control plane (no handlers), e.g. to try your own handlers with `declop run`.
dev: setup
	DECLOP_ASSETS_DIR=$$($(BUILD) 2>/dev/null) $(VENV)/bin/declop dev

# Plays the seed scenario by itself: start, kubectl run, label, delete, show the lines, stop.
demo: setup
	DECLOP_ASSETS_DIR=$$($(BUILD) 2>/dev/null) $(PY) tools/demo.py

test: setup
	DECLOP_ASSETS_DIR=$$($(BUILD) 2>/dev/null) $(PY) -m pytest $(PYTEST_ARGS)

test-unit: venv
	$(PY) -m pytest tests/unit tests/test_public_api.py tests/test_layers.py $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .declop .pytest_cache build *.egg-info

# Benchmarks (bench/README.md): declop vs Kopf vs controller-runtime on a local control plane.
# Results go to bench/results/<date>[-quick]/ (CSVs, summary.md, PNGs). BENCH_ARGS passes flags,
# e.g. make bench BENCH_ARGS="--resource crd" or BENCH_ARGS="--stall-100k".
.PHONY: bench bench-quick bench-deps
$(VENV)/.bench-installed: $(VENV)/.installed bench/requirements.txt
	$(PY) -m pip install -q -r bench/requirements.txt
	@touch $@

bench-deps: $(VENV)/.bench-installed

bench: setup bench-deps
	DECLOP_ASSETS_DIR=$$($(BUILD) 2>/dev/null) $(PY) bench/run.py $(BENCH_ARGS)

bench-quick: setup bench-deps
	DECLOP_ASSETS_DIR=$$($(BUILD) 2>/dev/null) $(PY) bench/run.py --quick $(BENCH_ARGS)
