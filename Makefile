# hami.node — one entry point for people and CI. `make demo` and `make test` each work on a fresh
# machine: they run `setup` first, which installs what is missing and nothing else.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
# Every pip that make runs, and the ones it starts (the molecule scenarios' and the sandbox's wheelhouse
# builds), installs the versions in constraints.txt: a new upstream release reaches the project only through
# `make lock` and a commit that passes the tests. Override with PIP_CONSTRAINT=<file> (empty: none).
export PIP_CONSTRAINT ?= $(CURDIR)/constraints.txt
PYTEST_ARGS ?= --durations=30 --durations-min=15  # the slowest tests in every run's log (CI's too)

.PHONY: setup lock system-deps gpusim test test-fast molecule lint bench chaos demo demo-quick sandbox-up sandbox-down clean \
	device-wheels hami-core-src device-check device-check-dry

setup: $(STAMP) gpusim

system-deps:
	scripts/install-system-deps.sh

$(STAMP): pyproject.toml constraints.txt
	scripts/install-system-deps.sh
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# Re-resolve the dependencies at their newest allowed versions into constraints.txt (then make test).
lock:
	PYTHON=$(PYTHON) scripts/lock-deps.sh

gpusim:
	$(MAKE) --no-print-directory -C tests/gpusim

# One molecule scenario as Ansible users run it (`make molecule S=dra`): builds the node image and the
# simulated apt repository when their inputs changed (cached by hash), then `molecule test -s $(S)`.
molecule: setup
	@test -n "$(S)" || { echo "usage: make molecule S=<scenario>; scenarios: $$(ls extensions/molecule/*/molecule.yml | cut -d/ -f3 | xargs)" >&2; exit 2; }
	@test -f extensions/molecule/$(S)/molecule.yml || { echo "no scenario extensions/molecule/$(S)" >&2; exit 2; }
	PATH="$(CURDIR)/$(BIN):$$PATH" tests/images/build-image.sh
	PATH="$(CURDIR)/$(BIN):$$PATH" tests/images/build-apt-repo.sh
	PATH="$(CURDIR)/$(BIN):$$PATH" molecule test -s $(S)

# Everything: unit, integration, e2e and molecule (as CI runs it).
test: setup
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest $(PYTEST_ARGS)

# Quick loop for developers: no molecule, no e2e.
test-fast: setup
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -m "not molecule and not e2e" $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check agent tests benchmarks plugins sandbox scripts tools
	PATH="$(CURDIR)/$(BIN):$$PATH" scripts/lint-ansible.sh

# Every benchmark but the chaos soak and the fleet, one table at the end (docs/performance.md). A benchmark
# exits 1 when it misses a goal it prints; `make bench` only reports (some goals are known misses, see
# docs/performance.md): `make bench BENCH_FLAGS=` makes a miss fail the target.
BENCH_FLAGS ?= --no-goals
bench: setup
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m benchmarks $(BENCH_FLAGS)

# The chaos soak (docs/testing.md "Chaos soak"): make chaos [CHAOS_SECONDS=3600] [CHAOS_SEED=17] [CHAOS_NODES=4]
CHAOS_SECONDS ?= 60
CHAOS_NODES ?= 4
chaos: setup
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m benchmarks chaos --seconds $(CHAOS_SECONDS) \
		--nodes $(CHAOS_NODES) $(if $(CHAOS_SEED),--seed $(CHAOS_SEED))

# The main job on the embedded default: the sandbox of simulated GPU nodes (needs root + podman).
demo: setup
	PATH="$(CURDIR)/$(BIN):$$PATH" scripts/demo.sh

# No containers: the seed 003 node on gpusim, its inventory and the bounded NVML hang (seconds).
demo-quick: setup
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m hami_agent.demo

sandbox-up: setup
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m sandbox up --provision

sandbox-down:
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m sandbox down

# Real hardware (docs/hardware.md). On a lent GPU machine, from a copy of this tree that carries .whl/ and
# .hami-core/: `make device-check` (its Python is the machine's python3; the agent runs from agent/).
# Here: `make device-wheels` downloads the wheels that machine lacks into .whl/ (ignored), `make hami-core-src
# HAMI_CORE_GIT=<url, clone or mirror>` exports HAMi-core's public source into .hami-core/ (ignored), and
# `make device-check-dry` runs the same script on gpusim.
DEVICE_PYTHON ?= python3
DEVICE_CHECK_OUT ?= device-check-output
DEVICE_CHECK_ARGS ?=
HAMI_CORE_GIT ?= https://github.com/Project-HAMi/HAMi-core.git
device-wheels: setup
	PYTHON=$(BIN)/python scripts/device-wheels.sh .whl

hami-core-src:
	scripts/hami-core-src.sh $(HAMI_CORE_GIT) .hami-core

DEVICE_SITE ?= /tmp/hami-device-site
device-check:
	if ls .whl/*.whl >/dev/null 2>&1; then PIP_CONSTRAINT= $(DEVICE_PYTHON) -m pip install -q --no-index --no-deps --no-compile \
		--no-cache-dir --upgrade --target $(DEVICE_SITE) .whl/*.whl; fi
	PYTHONPATH="$(DEVICE_SITE)$${PYTHONPATH:+:$$PYTHONPATH}" $(DEVICE_PYTHON) scripts/device_check.py \
		--out $(DEVICE_CHECK_OUT) $(if $(wildcard .hami-core/CMakeLists.txt),--hami-core-src .hami-core) \
		$(DEVICE_CHECK_ARGS)

device-check-dry: setup
	$(BIN)/python scripts/device_check.py --out $(DEVICE_CHECK_OUT) --dry-run $(DEVICE_CHECK_ARGS)

clean:
	$(MAKE) -C tests/gpusim clean
	rm -rf demo-output .pytest_cache
