#!/usr/bin/env bash
# The whole test suite, as `make test` and CI run it:
#   lint -> unit tests -> ansible-test sanity -> one shared lab fleet -> integration tests and molecule
#   scenarios -> lab down.
# Prints a timing summary at the end. Exits non-zero if any stage failed or if no test ran.
set -uo pipefail

cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
export PYTHONUNBUFFERED=1
export ANSIBLE_FORCE_COLOR=0
# Molecule scenarios share the lab this script boots, instead of each booting and destroying their own.
export GPUFLEET_LAB_KEEP=1

# Exported: molecule's create step (molecule/shared/create.yml) keeps the lab at this many hosts.
export GPUFLEET_TEST_LAB_HOSTS="${GPUFLEET_TEST_LAB_HOSTS:-2}"
LAB_HOSTS="$GPUFLEET_TEST_LAB_HOSTS"
# The lab's releases, cycled over the hosts: lab-1 Debian 12, lab-2 Debian 13, where the last-host tests run
# (test_driver, the fabric manager and reboot tests); each release's root file system is built on the first run
# and cached. GPUFLEET_TEST_LAB_OS=debian12 runs a Debian 12 lab only.
LAB_OS="${GPUFLEET_TEST_LAB_OS:-debian12,debian13}"
# `make test-slow` (GPUFLEET_TEST_SLOW=1) runs the lab tests marked slow too; `make test` leaves them out.
if [ "${GPUFLEET_TEST_SLOW:-0}" = 1 ]; then selection=(); else selection=(-m "not slow"); fi
declare -a stage_names=() stage_seconds=() stage_results=()
failed=0

run_stage() {
  local name="$1"; shift
  local started=$SECONDS rc
  echo "=== ${name}: $*"
  "$@"
  rc=$?
  # pytest exits 5 when it collected no test: that is a failure of the suite, not a pass.
  stage_names+=("$name"); stage_seconds+=($((SECONDS - started)))
  if [ "$rc" -eq 0 ]; then stage_results+=("ok"); else stage_results+=("FAILED (exit $rc)"); failed=1; fi
  return "$rc"
}

lab_down() {
  run_stage "lab down" gpufleet lab down || true
}

summary() {
  echo
  echo "=== timing summary"
  local i
  for i in "${!stage_names[@]}"; do
    printf '  %-28s %5ss  %s\n' "${stage_names[$i]}" "${stage_seconds[$i]}" "${stage_results[$i]}"
  done
  printf '  %-28s %5ss\n' "total" "$SECONDS"
}

# Python lint and format (pyproject.toml [tool.ruff]).
run_stage "ruff" bash -c "ruff check && ruff format --check"
run_stage "ansible-lint" ansible-lint
# Type checks of gpufleet/ and plugins/ (pyproject.toml [tool.mypy]).
run_stage "mypy" mypy
# --durations: the slowest tests in every run's output, where the suite's time goes (CI keeps the tail).
run_stage "unit tests" python -m pytest -q -n auto --durations=15 tests/unit
# ansible-core's own checks of the collection's content, offline (needs `make test`'s sanity wheelhouse).
run_stage "ansible-test sanity" scripts/sanity.sh

if run_stage "lab up (${LAB_HOSTS} hosts: ${LAB_OS})" gpufleet lab up --hosts "$LAB_HOSTS" --os "$LAB_OS"; then
  trap 'lab_down; summary' EXIT
  # Scenarios first: each converges its layer (and proves idempotence), so the lab ends up provisioned and
  # the integration tests (upgrades, tampering, drift, rebuild, serving) start from converged nodes.
  for scenario_dir in molecule/*/; do
    scenario="$(basename "$scenario_dir")"
    [ -f "${scenario_dir}molecule.yml" ] || continue
    run_stage "molecule ${scenario}" molecule test -s "$scenario"
  done
  run_stage "lab integration tests" python -m pytest -q --durations=30 "${selection[@]}" tests/integration
else
  trap 'lab_down; summary' EXIT
fi

exit "$failed"
