# Thin wrapper: the build itself is declared in pyproject.toml.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install demo test test-slow bench device-wheels clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# Re-install when the package definition or the native sources change.
$(STAMP): $(PY) pyproject.toml $(wildcard native/*.c native/*.h) \
          $(wildcard native/kernels/*.c native/kernels/*.h)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0  # the CPU build on disk, before the extra's range
	$(PY) -m pip install --quiet -e '.[dev,torch,plot]'
	touch $(STAMP)

install: $(STAMP)

# The demo: knowledge-graph embeddings (ComplEx) on a generated KG, 2 nodes under the launcher.
# Each epoch's summary goes to the terminal; its JSON line to .demo/epochs.jsonl.
DEMO := .demo
$(DEMO)/kg/train.txt: | $(STAMP)
	$(PY) -m adapm.apps.kge generate $(DEMO)/kg --triples 60000 --seed 1

demo: install $(DEMO)/kg/train.txt
	rm -rf $(DEMO)/epochs.jsonl $(DEMO)/baseline.jsonl $(DEMO)/model
	OMP_WAIT_POLICY=PASSIVE $(VENV)/bin/adapm-run -n 2 $(PY) -m adapm.apps.kge --data $(DEMO)/kg \
		--dim 32 --epochs 6 --export $(DEMO)/model --json $(DEMO)/epochs.jsonl
	@echo "The baseline: the same model, data order and threads in one process, no parameter manager..."
	@OMP_WAIT_POLICY=PASSIVE $(PY) -m adapm.apps.kge --data $(DEMO)/kg --dim 32 --epochs 6 \
		--baseline --workers 2 --eval-every 6 --progress off --json $(DEMO)/baseline.jsonl \
		> /dev/null 2>&1
	@$(PY) examples/explain_demo.py $(DEMO)/epochs.jsonl $(DEMO)/baseline.jsonl $(DEMO)/model

test: install
	$(PY) -m pytest -q

test-slow: install
	$(PY) -m pytest -q -m slow

# Every benchmark that has a quick mode, each against its peer in the same run (about 6
# minutes here); the full runs, their tables and the rest: docs/benchmarks.md.
BENCHES := store replicas remote engine adaptive kge mf wv ctr threads gil auth trace
bench: install
	@for b in $(BENCHES); do \
		echo "== bench/$$b.py --quick"; \
		OMP_WAIT_POLICY=PASSIVE $(PY) bench/$$b.py --quick || exit 1; \
	done

# A lent 16-core device (bench/device.sh) has Python 3.12 without pyzmq and no network: the
# wheels it needs, fetched here, travel with the device call (carry: [".whl"]).
device-wheels: install
	$(PY) -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
		--implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
		--platform manylinux2014_x86_64 -d .whl \
		"pyzmq==$$($(PY) -c 'import zmq; print(zmq.__version__)')" "setuptools>=74.1" \
		"threadpoolctl==$$($(PY) -c 'import threadpoolctl; print(threadpoolctl.__version__)')"

clean:
	rm -rf $(VENV) $(DEMO) build *.egg-info adapm/*.so
