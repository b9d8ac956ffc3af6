# Two commands: `make demo` runs the main job on the built-in lab, `make test` runs the whole suite.
# Both work on a fresh machine: they install the Debian packages and the .venv they need.
PYTHON ?= python3
VENV ?= .venv
VENV_STAMP := $(VENV)/.gpufleet-installed

.PHONY: demo test venv deps lint unit clean

demo: venv deps
	$(VENV)/bin/gpufleet demo

test: venv deps
	scripts/run-tests.sh

# Creates or updates .venv from the pinned requirements; a no-op when they have not changed.
venv: $(VENV_STAMP)

$(VENV_STAMP): requirements.txt pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet -r requirements.txt -e .
	touch $@

deps:
	scripts/install-deps.sh

lint: venv
	$(VENV)/bin/ansible-lint

unit: venv
	$(VENV)/bin/python -m pytest tests/unit

clean:
	rm -rf $(VENV) *.egg-info
