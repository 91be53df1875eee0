# Every target is idempotent; VENV defaults to .venv in the repo.
VENV ?= .venv
STAMP := $(VENV)/.fsbench-installed

.PHONY: setup run test clean-runs

$(STAMP): pyproject.toml scripts/setup.sh
	bash scripts/setup.sh $(VENV)
	touch $(STAMP)

setup: $(STAMP)

# The main job: the default CPU comparison on `small` (four trainers, 1 and 2 ranks), a table.
run: $(STAMP)
	$(VENV)/bin/fsbench sweep --workload small --trainers ddp,torchrec,deepspeed,freescale --world-sizes 1,2

test: $(STAMP)
	$(VENV)/bin/python -m pytest -q

clean-runs:
	rm -rf runs
