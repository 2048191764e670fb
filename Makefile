# The quick start: `make demo` (a local cluster and the hand-off demo), `make test`.
VENV ?= .venv
BIN := $(VENV)/bin
APPLIANCE := $(BIN)/nvrx-appliance

.PHONY: deps system-deps python-deps lint test test-unit test-integration golden-sbatch \
        cluster-up cluster-down cluster-status demo image bench gpu-check dist dist-check clean

deps: system-deps python-deps

system-deps:
	@if [ "$$(id -u)" -eq 0 ]; then bash scripts/install-system-deps.sh; \
	 else echo "system-deps: not root, skipping Debian packages (cluster tests will skip)"; fi

python-deps:
	bash scripts/install-python-deps.sh

# ruff, the type checker over the whole package (its settings: pyproject.toml), then
# promtool over the shipped alert rules (Debian's prometheus; required under CI=true).
RULES := nvrx_appliance/watch/alerts/nvrx-appliance.rules.yml
lint: python-deps
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	@if command -v promtool >/dev/null; then promtool check rules $(RULES); \
	 elif [ "$$CI" = true ]; then echo "lint: promtool is missing (make system-deps)" >&2; exit 1; \
	 else echo "lint: promtool is missing, $(RULES) not checked (make system-deps installs it)"; fi

# Unit tests (one worker per core: each test has its own tmp dir), then integration
# tests on the real local Slurm cluster, one at a time (brought up once per session,
# torn down at the end). Without root they skip, with the reason; under CI=true they
# must not.
test: deps
	$(BIN)/python -m pytest -n auto tests/unit
	$(BIN)/python -m pytest tests/integration

test-unit: python-deps
	$(BIN)/python -m pytest -n auto tests/unit

test-integration: deps
	$(BIN)/python -m pytest tests/integration

# Re-record the golden sbatch scripts (tests/unit/fixtures/sbatch/) after a deliberate
# change to the template or the renderer; review the diff before committing it.
golden-sbatch: python-deps
	$(BIN)/python -m tests.unit.golden_sbatch

cluster-up: deps
	$(APPLIANCE) cluster up

cluster-down: python-deps
	$(APPLIANCE) cluster down

cluster-status: python-deps
	$(APPLIANCE) cluster status

# `make demo SEGMENT=1`: the same demo in segment mode, on two-node NVLink domains.
demo: deps
	$(APPLIANCE) demo $(if $(SEGMENT),--segment)

image: deps
	$(APPLIANCE) image build

bench: deps
	$(BIN)/python -m bench

# On a GPU machine (no Slurm needed): the Megatron hand-off, two generations on one node.
# Needs GPU_CHECK_MEGATRON (a Megatron-LM checkout at the pinned commit); see the script.
# The project's venv where there is one (make python-deps), else the machine's python3;
# `make gpu-check GPU_CHECK_ARGS=--dry-run` prints the plans without a GPU.
gpu-check:
	$(if $(wildcard $(BIN)/python),$(BIN)/python,python3) scripts/gpu_check.py $(GPU_CHECK_ARGS)

# The host tool as a wheel for login nodes (docs/install.md): it needs
# only click and rich; spython comes with the `apptainer` extra.
DIST ?= dist
dist: python-deps
	rm -f $(DIST)/nvrx_appliance-*.whl
	$(BIN)/python -m pip wheel --quiet --no-deps --no-build-isolation -w $(DIST) .

# The wheel installed in a clean venv by a user who is not root, running submit --dry-run.
dist-check: dist
	bash scripts/check-wheel.sh $(DIST)

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .ruff_cache
