# Everything a fresh machine needs, in two targets: `make demo` and `make test` (README.md).
SHELL := /bin/bash
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.frscope-installed

.PHONY: demo test check lint typecheck importlint unit venv clean deps-apt testenv cluster cluster-node \
	cluster-node-down torch-venvs node-images controllers accuracy-sweep dist registry testenv-oldest \
	test-kube-matrix library-sweep random-sweep

# setup.py and the C scanner too: `pip install -e .` builds frscope/records/_frscan.c in place (optional: without a
# compiler frscope reads dumps with the pure-Python path), so a change to either rebuilds it.
$(STAMP): pyproject.toml setup.py frscope/records/_frscan.c frscope/records/_frscan_groups.c frscope/records/_frscan_json.c \
  frscope/records/_frscan_fields.h frscope/records/_frscan_arena.h
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch comes from pip's cache after the first install (several GB: the CUDA build runs on the CPU)
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

# A real 4-rank gloo job on loopback that hangs; frscope collects every rank's recorder and stacks
# while it is blocked and prints the diagnosis. No cluster needed.
demo: $(STAMP)
	$(BIN)/frscope demo $(DEMO_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check frscope tests bench scripts

typecheck: $(STAMP)
	$(BIN)/mypy

importlint: $(STAMP)
	$(BIN)/lint-imports

check: lint typecheck importlint

# System packages the tests drive, from Debian: chromium + chromium-driver for the browser tests of the
# HTML timeline (tests/browser). Idempotent: apt runs only when one is missing. Other components add
# theirs to APT_PACKAGES.
APT_PACKAGES += chromium chromium-driver fonts-dejavu-core
# promtool and a real Prometheus server for the sidecar's metrics tests (tests/integration/test_sidecar_live.py).
APT_PACKAGES += prometheus
# The real node (testenv/node.py, tests/node): containerd, runc and the CNI plugins; buildah and debootstrap
# build its images; a C compiler builds the
# sandbox ("pause") binary; iptables and conntrack for kube-proxy.
APT_PACKAGES += containerd runc containernetworking-plugins buildah debootstrap gcc libc6-dev \
	iptables conntrack
# shellcheck: actionlint (tests/unit/test_workflows.py) checks the workflows' run: scripts with it.
APT_PACKAGES += shellcheck
deps-apt:
	@missing=""; for p in $(sort $(APT_PACKAGES)); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "deps-apt: installing$$missing"; \
	  sudo=""; [ "$$(id -u)" = 0 ] || sudo=sudo; \
	  $$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq $$missing >/dev/null; \
	fi

# What `pip install frscope` installs (docs/release.md): the sdist and a manylinux wheel with the C scanner,
# cached by source hash; the last line printed is their directory. tests/integration/test_distribution.py
# installs that wheel into a fresh venv.
dist:
	scripts/build-dist

# The real Kubernetes control plane for tests/e2e (docs/testenv.md): built from the Go module proxy once,
# then reused from ~/.cache/frscope-testenv. Exit 3 = Go is not installed: the e2e tests skip.
testenv:
	testenv/build || [ $$? -eq 3 ]

# The Kubernetes version matrix (tests/e2e/test_kube_versions*.py, docs/testenv.md): each release besides the
# default one has its module in testenv/kube/<version>/ and its own cached control plane. `make test` builds the
# oldest (after the default: one Go build at a time); `make test-kube-matrix` builds every release and runs the
# matrix tests (those not built are skipped in `make test`).
KUBE_RELEASES = $(shell ls testenv/kube 2>/dev/null | sort -V)
testenv-oldest: testenv
	@oldest="$(firstword $(KUBE_RELEASES))"; [ -z "$$oldest" ] || testenv/build --version "$$oldest" >/dev/null || [ $$? -eq 3 ]

test-kube-matrix: $(STAMP) testenv
	for v in $(KUBE_RELEASES); do testenv/build --version $$v >/dev/null || [ $$? -eq 3 ] || exit 1; done
	$(BIN)/pytest -m kube_matrix $(PYTEST_ARGS)

# etcd + kube-apiserver + kube-controller-manager in the foreground; prints the KUBECONFIG to export.
cluster:
	testenv/up

# Other torch versions, each in its own venv cached outside the repo (scripts/torch-venv), for
# tests/integration/test_torch_versions.py and the launcher matrix; a version not built here is skipped
# there. The CUDA wheels that .venv (torch 2.13.0) or an earlier venv here already holds at the same
# version are hard-linked, not downloaded: 2.14.1 then fetches only torch and cuDNN. Cold, measured on
# the 2 shared cores (load 5-10): 2.15.0 4.0-5.1 min and 4.0 GB, then 2.14.1 2.1-3.4 min and 2.1 GB more
# (3.2-3.8 min and 4.5 GB without the links); warm: nothing to do. It waits for .venv, the main donor.
# Also what torch's own debug server imports in rank 0 besides torch (tabulate; Jinja2 the venvs have), in
# a folder of its own beside the venvs (tests/integration/test_torch_debug_server.py puts it on the job's
# PYTHONPATH); the venvs themselves are never changed.
TORCH_VERSIONS ?= 2.15.0 2.14.1
DEBUG_SERVER_DEPS = $(or $(FRSCOPE_TORCH_CACHE),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/frscope-torch)/debug-server-deps
torch-venvs: $(STAMP)
	PY=$(PY) FRSCOPE_TORCH_DONORS=$(abspath $(VENV)) scripts/torch-venv $(TORCH_VERSIONS) >/dev/null
	test -d $(DEBUG_SERVER_DEPS)/tabulate || $(BIN)/pip install --quiet --target $(DEBUG_SERVER_DEPS) tabulate


# A real one-node cluster in the background (docs/testenv.md): builds what is missing (testenv/build,
# testenv/build-images), starts the control plane, containerd, kubelet, kube-scheduler, kube-proxy, CoreDNS
# and the Kubeflow training operator; the last line of stdout is `export KUBECONFIG=...`. Needs root.
# TRAINER=1: also Kubeflow Trainer v2 and JobSet, each in a pod (testenv/build-controllers builds them).
cluster-node: deps-apt
	@PIP=$(abspath $(BIN))/pip $(PY) testenv/node.py up --background $(if $(TRAINER),--trainer)

# Stops everything cluster-node started (by PID), unmounts what it mounted, removes its network.
cluster-node-down:
	@$(PY) testenv/node.py down

# The node's images (tests/node) and the Trainer/JobSet and Kueue controllers (tests marked `controllers`): the
# tests build what is missing themselves; built here beforehand so that a cold run overlaps them with
# the rest. Root only (buildah, debootstrap); elsewhere the node tests skip and so does this.
node-images: $(STAMP) deps-apt testenv
	@if [ "$$(id -u)" = 0 ] && bin="$$(testenv/build --check)"; then \
	  PIP=$(abspath $(BIN))/pip testenv/build-images "$$bin" >/dev/null; fi

# The node's OCI registry (testenv/build-registry: the CNCF registry from its Go module; the node tests push
# the frscope image and chart to it and install from it). Built before the suite so a cold run overlaps it.
registry:
	testenv/build-registry >/dev/null || [ $$? -eq 3 ]

# Each other JobSet release (testenv/jobset/<version>: v0.11.0) is built alone after them, for the e2e tests
# parametrized over JobSet releases (tests/e2e/jobset_versions.py; about 3.5 CPU-minutes cold).
JOBSET_RELEASES = $(shell ls testenv/jobset 2>/dev/null | sort -V)
controllers: deps-apt
	testenv/build-controllers >/dev/null || [ $$? -eq 3 ]
	for v in $(JOBSET_RELEASES); do testenv/build-controllers --jobset $$v >/dev/null || [ $$? -eq 3 ] || exit 1; done
	@# their images, for the node tests that deploy Trainer and JobSet in pods (seconds; root only)
	@if [ "$$(id -u)" = 0 ] && dir="$$(testenv/build-controllers --check)"; then \
	  testenv/build-images --controllers "$$dir" >/dev/null; fi
	testenv/build-kueue >/dev/null || [ $$? -eq 3 ]
	@if [ "$$(id -u)" = 0 ] && dir="$$(testenv/build-kueue --check)"; then \
	  testenv/build-images --kueue "$$dir" >/dev/null; fi
	@# node-problem-detector, for the node ledger's e2e test (tests/e2e/test_tenants_e2e.py)
	testenv/build-npd >/dev/null || [ $$? -eq 3 ]

# What the suite needs, built side by side on a cold machine (the Go builds are CPU-bound, the torch
# venvs and images mostly download and unpack): then the suite, its folders in three lanes at once
# (scripts/test_lanes.py; PYTEST_ARGS go to every lane, or with a test path to one pytest).
test:
	$(MAKE) -j3 check deps-apt testenv testenv-oldest torch-venvs node-images controllers registry
	BIN=$(BIN) $(BIN)/python scripts/test_lanes.py $(PYTEST_ARGS)

# The accuracy benchmark (issue 23, not part of `make test`): SWEEP_JOBS real torch jobs with faults drawn
# from SWEEP_SEED (frscope/testing/sweep), run a few at a time at low priority, captured under
# ~/.cache/frscope-sweep/<seed> (re-running skips jobs already captured), scored (frscope and torchfrtrace),
# and docs/accuracy.md written from it. torch 2.15 joins when `make torch-venvs` has built its venv. A scored
# second run of the first jobs in $(SWEEP_DIR)-repeat (run ... --jobs 52 --out that; score it) adds the
# report's stability section.
SWEEP_SEED ?= 2313
SWEEP_JOBS ?= 325
SWEEP_PARALLEL ?= 3
SWEEP_DIR ?= $(HOME)/.cache/frscope-sweep/$(SWEEP_SEED)
accuracy-sweep: $(STAMP)
	nice -n 10 $(BIN)/python scripts/fault_sweep.py run --seed $(SWEEP_SEED) --jobs $(SWEEP_JOBS) \
	  --parallel $(SWEEP_PARALLEL) --out $(SWEEP_DIR)
	nice -n 10 $(BIN)/python scripts/fault_sweep.py score $(SWEEP_DIR) > /dev/null
	$(BIN)/python scripts/fault_sweep.py report $(SWEEP_DIR) --results-copy docs/accuracy-sweep.json \
	  $$(test -f $(SWEEP_DIR)-repeat/results.json && echo --repeat $(SWEEP_DIR)-repeat)

# Library-driven real jobs (issue 33, not part of `make test`; tests/integration/test_library_jobs.py runs a
# sample): DDP, FSDP2, DTensor TP, a 3-D DeviceMesh, DCP save, object collectives, scatter/gather,
# monitored_barrier, pipelining and a DataLoader worker, healthy and with faults, under every torch venv
# built (`make torch-venvs`), each judged in three forms. About 35 s a job on 2 cores.
LIBJOBS_DIR ?= $(HOME)/.cache/frscope-libjobs
library-sweep: $(STAMP)
	PY=$(PY) scripts/torch-venv $(TORCH_VERSIONS) >/dev/null
	nice -n 10 $(BIN)/python -m frscope.testing.libjobs sweep --out $(LIBJOBS_DIR) --torch 2.13,2.14,2.15

# The random-program sweep (frscope/testing/randprog, docs/accuracy.md): 100,000 simulated programs (no torch,
# 1.5-3.5 h on 2 shared cores), each judged in three capture forms; not part of `make test` (tests/unit/
# test_randprog_sample.py runs a seeded 200). Replay a miss with `python -m frscope.testing.randprog replay SEED`.
RANDOM_SEED ?= 1
RANDOM_PROGRAMS ?= 100000
RANDOM_JOBS ?= 2
random-sweep: $(STAMP)
	nice -n 10 $(BIN)/python -m frscope.testing.randprog sweep --seed $(RANDOM_SEED) --programs $(RANDOM_PROGRAMS) \
	  --jobs $(RANDOM_JOBS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
