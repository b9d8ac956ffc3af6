#!/usr/bin/env bash
# ansible-test sanity on the collection, offline.
#
# ansible-test wants the collection under ansible_collections/gpufleet/fleet and reads its real path, which the
# checkout's collections/ link is not: the tracked and new files are copied there, less links to directories
# (the collections/ link back to the root, a linked .venv: not content, and ansible-test refuses them).
# ansible-test runs each check in a virtualenv of its own, bootstrapped with pip from ci-files.testing.ansible.com
# and filled from PyPI. Neither is used here: a private HOME holds a pip.conf that installs only from the
# wheelhouse `make venv` downloads beside the venv (SANITY_WHEELS), and a bootstrap script that runs pip
# from that wheelhouse. A fresh HOME each run: nothing comes from an earlier run.
# SANITY_TARBALL=<collection tarball> checks the built collection instead of the checkout.
# `scripts/sanity.sh --download-wheels` fills that wheelhouse (online, once); other arguments go to
# ansible-test (e.g. --test pep8). The checks run on the Ansible content: plugins/, roles/, playbooks/, meta/,
# changelogs/ (the CLI, lab tooling, bench and tests are plain Python, not Ansible content).
set -euo pipefail

cd "$(dirname "$0")/.."
repo="$PWD"
venv_bin="$repo/.venv/bin"
wheels="${SANITY_WHEELS:-$repo/.venv/sanity-wheels}"

if [ "${1:-}" = "--download-wheels" ]; then
  # The pins of ansible-core's own sanity requirement files, and the pip its virtualenvs are bootstrapped with.
  mapfile -t pins < <("$venv_bin/python" - <<'PY'
import glob
import os
import sys

import ansible_test
from ansible_test._internal.host_configs import NativePythonConfig
from ansible_test._internal.python_requirements import get_venv_packages

requirements = os.path.join(os.path.dirname(ansible_test.__file__), "_data", "requirements")
for path in sorted(glob.glob(os.path.join(requirements, "sanity.*.txt"))):
    print("-r")
    print(path)
version = "%d.%d" % sys.version_info[:2]
print("pip==" + get_venv_packages(NativePythonConfig(version=version))["pip"])
PY
)
  exec "$venv_bin/python" -m pip download --quiet --only-binary=:all: --dest "$wheels" "${pins[@]}"
fi

pip_wheel="$(ls "$wheels"/pip-*.whl 2>/dev/null | head -n 1)"
if [ -z "$pip_wheel" ]; then
  echo "no pip wheel in $wheels: run \`make venv\` (it downloads the sanity wheelhouse)" >&2
  exit 2
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

dest="$work/ansible_collections/gpufleet/fleet"
mkdir -p "$dest"
if [ -n "${SANITY_TARBALL:-}" ]; then
  # The built collection instead of the checkout (make release-check): what Galaxy's own sanity run sees.
  tar -xzf "$SANITY_TARBALL" -C "$dest"
else
  git ls-files -z --cached --others --exclude-standard \
    | while IFS= read -r -d '' file; do
        if [ -e "$file" ] && ! { [ -L "$file" ] && [ -d "$file" ]; }; then printf '%s\0' "$file"; fi
      done \
    | tar --null --files-from=- -cf - | tar -xf - -C "$dest"
fi

export HOME="$work/home"
mkdir -p "$HOME/.config/pip" "$HOME/.ansible/test/cache"
printf '[global]\nno-index = true\nfind-links = %s\n' "$wheels" > "$HOME/.config/pip/pip.conf"
pip_version="$(basename "$pip_wheel" | cut -d- -f2)"
# What get-pip.py does with the arguments ansible-test gives it, with pip taken from its wheel.
cat > "$HOME/.ansible/test/cache/get_pip_${pip_version//./_}.py" <<PY
import runpy
import sys

sys.path.insert(0, "$pip_wheel")
sys.argv[1:] = ["install"] + [arg for arg in sys.argv[1:] if arg not in ("--no-setuptools", "--no-wheel")]
runpy.run_module("pip", run_name="__main__", alter_sys=True)
PY

cd "$dest"
export PATH="$venv_bin:$PATH"
python_version="$("$venv_bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
exec "$venv_bin/ansible-test" sanity --color no --python "$python_version" "$@" \
  plugins/ roles/ playbooks/ meta/ changelogs/
