# One command per job; each does its own set-up (scripts/setup.sh is idempotent).
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup test test-heavy commongen commongen-assets app

setup:
	bash scripts/setup.sh

test: setup
	$(PY) -m pytest -n 2 -m "not heavy"

test-heavy: setup
	$(PY) -m pytest -m heavy

commongen: setup
	$(PY) -m experiments.commongen   # 100 dev items, logical vs ctrlg, the paper's pipeline with 8 beams

commongen-assets: setup   # re-create the adapted pipeline's adapters and HMM (hours on a 2-core CPU)
	bash scripts/commongen_assets.sh

app: setup
	$(PY) -m ctrlg.app
