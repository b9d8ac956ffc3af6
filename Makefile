# Two commands: `make demo` runs the main job on the built-in lab, `make test` runs the whole suite.
# Both work on a fresh machine: they install the Debian packages and the .venv they need.
PYTHON ?= python3
VENV ?= .venv
VENV_STAMP := $(VENV)/.gpufleet-installed
# The wheels ansible-test's sanity checks install into their own virtualenvs (the pins ansible-core ships),
# downloaded once so that `scripts/sanity.sh` runs offline.
SANITY_WHEELS := $(VENV)/sanity-wheels
SANITY_STAMP := $(SANITY_WHEELS)/.downloaded

.PHONY: demo test test-slow venv lock lock-release deps lint unit sanity clean collection ee-context release-check

demo: venv deps
	$(VENV)/bin/gpufleet demo

test: venv deps $(SANITY_STAMP)
	scripts/run-tests.sh

# The whole suite with the long lab tests marked slow (the rebuilds, the Ray cluster, two rollout cases): run before
# an issue that touches them is resolved.
test-slow: venv deps $(SANITY_STAMP)
	GPUFLEET_TEST_SLOW=1 scripts/run-tests.sh

# Creates or updates .venv from the locked requirements (every package pinned with its sha256: pip refuses any
# other file; the venv's own pip installs them, no unpinned upgrade of it first); a no-op when they have not changed. gpufleet itself goes in editable, its dependencies from the lock.
venv: $(VENV_STAMP)

$(VENV_STAMP): requirements.txt pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --require-hashes -r requirements.txt
	$(VENV)/bin/python -m pip install --quiet --no-deps -e .
	touch $@

# requirements.in (the direct dependencies, pinned) -> requirements.txt (all of them, with hashes), for CI's
# Python and platform whatever machine runs it.
lock: venv
	$(VENV)/bin/uv pip compile requirements.in --generate-hashes --python-version 3.11 \
	  --python-platform x86_64-manylinux_2_28 --custom-compile-command "make lock" -o requirements.txt

$(SANITY_STAMP): $(VENV_STAMP)
	SANITY_WHEELS=$(SANITY_WHEELS) scripts/sanity.sh --download-wheels
	touch $@

deps:
	scripts/install-deps.sh

lint: venv
	$(VENV)/bin/ruff check
	$(VENV)/bin/ruff format --check
	$(VENV)/bin/ansible-lint
	$(VENV)/bin/mypy

unit: venv
	$(VENV)/bin/python -m pytest -n auto tests/unit

# ansible-test sanity on the collection's Ansible content, offline (scripts/sanity.sh says how).
sanity: $(SANITY_STAMP)
	scripts/sanity.sh

# The repository is the collection gpufleet.fleet (galaxy.yml); its tarball lands in build/.
collection: venv
	$(VENV)/bin/ansible-galaxy collection build --force --output-path build

# Before a release: galaxy-importer, ansible-test sanity and antsibull-docs on the built tarball
# (scripts/release-check.sh; its tools go into .venv-release from requirements-release.txt).
release-check: collection $(SANITY_STAMP)
	scripts/release-check.sh

lock-release: venv
	$(VENV)/bin/uv pip compile requirements-release.in --generate-hashes --python-version 3.11 \
	  --python-platform x86_64-manylinux_2_28 --custom-compile-command "make lock-release" -o requirements-release.txt

# The build context execution-environment.yml expects: the collection tarball under a name without its version.
ee-context: collection
	mkdir -p ee-collections
	cp build/gpufleet-fleet-$$($(VENV)/bin/python -c 'import yaml; print(yaml.safe_load(open("galaxy.yml"))["version"])').tar.gz ee-collections/gpufleet-fleet.tar.gz

clean:
	rm -rf $(VENV) .venv-release *.egg-info
