# Two commands do everything on a fresh Debian-like machine with Python 3.11 and Go, as root:
#   make run    set up, start a local cluster with a real node, the seed example in it as a Pod
#   make test   set up, run the whole test suite against a real control plane and node
# Without root: make test-fast (everything but the node tests), make run-without-node.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DECLOP := $(VENV)/bin/declop
# the control plane's binaries: `declop assets build` builds them once (the Go module ships in
# the package, declop/assets/controlplane/); ASSETS is their folder, for DECLOP_ASSETS_DIR
ASSETS := $$($(DECLOP) assets path)
NODE_BUILD := tools/node/build.sh
# quiet pip: no root-user or new-version warnings before the control plane's lines
export PIP_ROOT_USER_ACTION := ignore
export PIP_DISABLE_PIP_VERSION_CHECK := 1
IMAGE_TAR ?= build/declop-image.tar

.PHONY: all setup venv controlplane node image lock pin-base run run-without-node dev demo test test-fast test-unit test-typed-props sim mutate dist clean

all: test

$(VENV)/.installed: setup.cfg pyproject.toml
	@echo "[setup] creating $(VENV) and installing declop with its test extras"
	@$(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -q --upgrade pip
	@# PYTHONWARNINGS: setuptools' "Editable installation" banner is a warning that -q lets through
	@PYTHONWARNINGS=ignore $(PY) -m pip install -q -e '.[test,fast,dev]'
	@touch $@

venv: $(VENV)/.installed

# Builds kube-apiserver, kube-controller-manager, etcd, kubectl and helm once (10-20 min cold),
# then finds them in ~/.cache/declop/controlplane in a second.
controlplane: venv
	@$(DECLOP) assets build >/dev/null

setup: venv controlplane

# The local node's binaries (kubelet, kube-scheduler, kube-proxy, buildkitd, buildctl, pause) into
# ~/.cache/declop/node, and its Debian packages (containerd, runc, CNI plugins, iptables,
# debootstrap) when missing — that part needs root. ~2 min with a warm Go cache, then a second.
node:
	@$(NODE_BUILD) >/dev/null

# The Dockerfile's image, declop:<version>, built by BuildKit (no Docker daemon, no registry) on
# a debootstrap Python base, as an OCI archive: ctr -n k8s.io images import $(IMAGE_TAR).
# Needs root. The OCI layout sits beside it ($(IMAGE_TAR:.tar=.oci)) for images FROM declop.
image: venv
	@assets=$$($(NODE_BUILD)) && DECLOP_NODE_ASSETS_DIR=$$assets $(PY) -m declop.testing.cluster.image_cli --output $(IMAGE_TAR)

# The image's Python dependencies, pinned with hashes (Dockerfile: pip install --require-hashes):
# requirements/image.lock (install_requires + the `fast` extra) and requirements/build.lock (the
# build backend), resolved by uv for CPython 3.11 on manylinux x86_64 / glibc 2.36 (the base).
# Keeps existing pins; LOCK_ARGS=--upgrade (or --upgrade-package NAME) moves them.
# tests/unit/testing/cluster/test_image.py checks the locks against setup.cfg and pyproject.toml.
UV_VERSION := 0.13.8
LOCK_FLAGS := --quiet --generate-hashes --python-version 3.11 --python-platform x86_64-manylinux_2_36 \
	--custom-compile-command "make lock" $(LOCK_ARGS)
lock: venv
	$(PY) -m pip install -q "uv==$(UV_VERSION)"
	$(VENV)/bin/uv pip compile setup.cfg --extra fast $(LOCK_FLAGS) -o requirements/image.lock
	$(PY) -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"], sep="\n")' \
		| $(VENV)/bin/uv pip compile - $(LOCK_FLAGS) -o requirements/build.lock

# The Dockerfile's default base, python:<tag>@sha256:<digest>: asks Docker Hub for the tag's
# current digest and rewrites the ARG line (needs the registry; one line saying so otherwise).
pin-base:
	@tools/pin-base.sh

# The seed example in-cluster: control plane + a real node, the image from the Dockerfile, the
# chart with examples/pods.py as its handlers and the RBAC `declop rbac examples/pods.py --values`
# generates for them (least privilege, as in a real cluster); the Pod's logs follow. In a second terminal:
#   export KUBECONFIG=$$PWD/.declop/kubeconfig PATH=<assets>:$$PATH   (printed at start)
#   kubectl run nginx --image nginx; kubectl label pod nginx env=prod; kubectl delete pod nginx
run: setup node
	@DECLOP_ASSETS_DIR=$(ASSETS) DECLOP_NODE_ASSETS_DIR=$$($(NODE_BUILD) 2>/dev/null) \
		$(DECLOP) dev --node examples/pods.py

# The seed example as a local process on a control plane without a node (no root needed). A plain
# kubectl delete pod nginx finishes at once: nothing scheduled the Pod, so nothing has to stop it.
run-without-node: setup
	@DECLOP_ASSETS_DIR=$(ASSETS) $(DECLOP) dev examples/pods.py

# Only the control plane (no handlers), e.g. to try your own handlers with `declop run`.
dev: setup
	@DECLOP_ASSETS_DIR=$(ASSETS) $(DECLOP) dev

# Plays the seed scenario by itself: start, kubectl run, label, delete, show the lines, stop.
demo: setup
	@DECLOP_ASSETS_DIR=$(ASSETS) $(PY) tools/demo.py

# Everything, the node tests included (root; tests/node run in the same serial pytest run).
test: setup node
	DECLOP_ASSETS_DIR=$(ASSETS) DECLOP_NODE_ASSETS_DIR=$$($(NODE_BUILD) 2>/dev/null) \
		$(PY) -m pytest $(PYTEST_ARGS)

# Everything but the tests that need a real node (and root): for laptops and quick checks.
test-fast: setup
	DECLOP_ASSETS_DIR=$(ASSETS) $(PY) -m pytest -m "not node" $(PYTEST_ARGS)

test-unit: venv
	$(PY) -m pytest tests/unit tests/test_public_api.py tests/test_layers.py $(PYTEST_ARGS)

# The typed status round trips (tests/integration/test_typed_status_props.py) with PROPS_EXAMPLES
# Hypothesis examples and a random seed; `make test` runs 6 with a fixed one. ~3 s an example.
PROPS_EXAMPLES ?= 100
test-typed-props: setup
	DECLOP_ASSETS_DIR=$(ASSETS) DECLOP_PROPS_EXAMPLES=$(PROPS_EXAMPLES) \
		$(PY) -m pytest tests/integration/test_typed_status_props.py $(PYTEST_ARGS)

# The Lease simulator (docs/simulation.md): SIM_SEEDS seeds of each scenario family (10,000
# by default), in SIM_JOBS processes, one line per failure. SIM_SEEDS=300 is what `make test` runs.
# Then the world's families (real managers, every fault kind, the protocol-placed ones too):
# SIM_SEEDS of each mode and shape, as `make test`'s world sweep runs 350 of each mode.
SIM_SEEDS ?= 10000
SIM_JOBS ?= 2
SIM_FAMILIES ?= leader sharded-uid sharded-namespace rolling shared-id
SIM_WORLD_MODES ?= leader sharded
# the built-in handler's shapes each world mode runs in (docs/simulation.md): default (async def,
# priority queue), plain-fifo (a plain def in batches on the FIFO WorkQueue) and background (the
# default with a leader-only background task, I14)
SIM_WORLD_SHAPES ?= default plain-fifo background
SIM_WORLD_FAULTS := hang,fail,cut,slow,pause,crash,compact,pause-at-write,term,delete,stuck,term-in-call,hang-leases,wall-jump,rollout,partition-holder,pause-holder,errors,unsynced,clocks
sim: venv
	@for family in $(SIM_FAMILIES); do \
		echo "== $$family"; \
		$(PY) -m declop.testing.simulation.leases --scenario $$family --seeds $(SIM_SEEDS) --jobs $(SIM_JOBS) || failed=1; \
	done; \
	for mode in $(SIM_WORLD_MODES); do for shape in $(SIM_WORLD_SHAPES); do \
		case $$shape in plain-fifo) flags="--plain --fifo";; background) flags="--background";; *) flags="";; esac; \
		echo "== world $$mode $$shape"; \
		$(PY) -m declop.testing.simulation.world --mode $$mode $$flags --seeds $(SIM_SEEDS) --jobs $(SIM_JOBS) \
			--objects 40 --duration 40 --faults $(SIM_WORLD_FAULTS) || failed=1; \
	done; done; exit $${failed:-0}

# Mutation testing of the code the simulator claims to prove (tools/mutate.py, docs/simulation.md
# "Mutation testing"): Cosmic Ray writes each mutant to disk and runs the sweep, the simulator's
# other tests and the group's unit tests under it; build/mutate/report.md gets the scores and every
# survivor. Hours for every group: MUTATE_GROUPS="fence" and MUTATE_ARGS="--sample 30" narrow it;
# a second `make mutate` resumes the sessions (MUTATE_ARGS=--fresh starts again).
# Cosmic Ray comes with the test extras.
MUTATE_GROUPS ?=
mutate: venv
	$(PY) tools/mutate.py run $(MUTATE_GROUPS) $(MUTATE_ARGS)

# A wheel and an sdist in dist/, for `pip install dist/declop-*.whl` outside this checkout: the
# sdist first, then the wheel built from it (so the sdist is proven complete). `build` comes
# with the test extras.
dist: venv
	@rm -rf dist build
	@$(PY) -m build --quiet --outdir dist .

clean:
	rm -rf $(VENV) .declop .pytest_cache build dist *.egg-info

# Benchmarks (bench/README.md): declop vs Kopf vs controller-runtime on a local control plane.
# Results go to bench/results/<date>[-quick]/ (CSVs, summary.md, PNGs). BENCH_ARGS passes flags,
# e.g. make bench BENCH_ARGS="--resource crd" or BENCH_ARGS="--stall-100k".
.PHONY: bench bench-quick bench-deps bench-pairs
$(VENV)/.bench-installed: $(VENV)/.installed bench/requirements.txt
	$(PY) -m pip install -q -r bench/requirements.txt
	@touch $@

bench-deps: $(VENV)/.bench-installed

bench: setup bench-deps
	DECLOP_ASSETS_DIR=$(ASSETS) $(PY) bench/run.py $(BENCH_ARGS)

bench-quick: setup bench-deps
	DECLOP_ASSETS_DIR=$(ASSETS) $(PY) bench/run.py --quick $(BENCH_ARGS)

# make bench-pairs BASE=<commit> [RUNS=5] [MICRO=1]: that commit against this working tree,
# interleaved (bench/pairs.py): the hot-path micro pairs, then (without MICRO=1) cold start and
# churn on one control plane. How a performance claim in a closing note is made.
RUNS ?= 5
bench-pairs: setup bench-deps
	@test -n "$(BASE)" || { echo "make bench-pairs: say which commit to compare with, e.g. make bench-pairs BASE=main~1" >&2; exit 2; }
	DECLOP_ASSETS_DIR=$(ASSETS) $(PY) bench/pairs.py --base $(BASE) --runs $(RUNS) $(if $(MICRO),--micro-only,--micro) \
		--out bench/results/$$(date +%F)-pairs-$$(git rev-parse --short $(BASE))
