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
	$(PY) -m experiments.commongen generation.num_beams=4   # 100 dev items, logical vs ctrlg; 4 beams keep it under 10 minutes (the table: 8)

commongen-assets: setup   # re-create the adapted pipeline's adapters and HMM (hours on a 2-core CPU)
	bash scripts/commongen_assets.sh

app: setup
	$(PY) -m ctrlg.app
