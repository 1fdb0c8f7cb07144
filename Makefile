# Thin wrapper: the build itself is declared in pyproject.toml.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install demo test test-slow bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# Re-install when the package definition or the native sources change.
$(STAMP): $(PY) pyproject.toml $(wildcard native/*.c native/*.h)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(VENV)/bin/adapm-run -n 2 $(PY) examples/demo.py

test: install
	$(PY) -m pytest -q

test-slow: install
	$(PY) -m pytest -q -m slow

bench: install
	$(PY) bench/store.py
	$(PY) bench/remote.py

clean:
	rm -rf $(VENV) build *.egg-info adapm/*.so
