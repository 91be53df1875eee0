# Every target is idempotent; VENV defaults to .venv in the repo.
VENV ?= .venv
STAMP := $(VENV)/.fsbench-installed

.PHONY: setup run test test-dist test-nightly test-all bench reference gate clean-runs

$(STAMP): pyproject.toml scripts/setup.sh
	bash scripts/setup.sh $(VENV)
	touch $(STAMP)

setup: $(STAMP)

# The main job: the default CPU comparison on `small` (four trainers, 1 and 2 ranks), a table.
run: $(STAMP)
	$(VENV)/bin/fsbench sweep --workload small --trainers ddp,torchrec,deepspeed,freescale --world-sizes 1,2

# The fast tier: unit tests, no process starts ranks (a guard in tests/conftest.py fails an
# unmarked test that does). test-dist: the multi-process gloo and end-to-end tests; those
# marked parallel_safe (no timing, no contention check) two at a time, a file to a worker,
# then the rest one at a time on a machine left to them.
# test-nightly: slow end-to-end checks of rare paths, for a scheduled CI (docs/ci.md).
test: $(STAMP)
	$(VENV)/bin/python -m pytest -q -m "not dist"

test-dist: $(STAMP)
	$(VENV)/bin/python -m pytest -q -m "dist and not nightly and parallel_safe" -n 2 --dist loadfile
	$(VENV)/bin/python -m pytest -q -m "dist and not nightly and not parallel_safe"

test-nightly: $(STAMP)
	$(VENV)/bin/python -m pytest -q -m nightly

test-all: test test-dist test-nightly

# The quick asv suite against this environment (no builds), then the pytest-benchmark suite.
bench: $(STAMP)
	$(VENV)/bin/asv machine --yes > /dev/null
	$(VENV)/bin/asv run --python=same --quick --show-stderr
	$(VENV)/bin/python -m pytest benchmarks -q --benchmark-only

# Rewrite results/reference/ (deterministic gates) after an intended change; commit them.
reference: $(STAMP)
	$(VENV)/bin/fsbench reference refresh

# This checkout against its parent commit, on this machine (exit 1 on a regression).
gate: $(STAMP)
	$(VENV)/bin/fsbench gate --base HEAD~1

clean-runs:
	rm -rf runs
