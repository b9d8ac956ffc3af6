#!/usr/bin/env bash
# make release-check: what Galaxy and the docs site would say of the collection before a release, on the built
# tarball (build/gpufleet-fleet-<version>.tar.gz, `make collection`):
#   1. galaxy-importer, as Galaxy imports it (its own ansible-lint; its ansible-test runs in a container, so it is
#      off here and 2. runs it);
#   2. ansible-test sanity on the tarball's content, with the ignores it ships (scripts/sanity.sh, offline);
#   3. antsibull-docs' collection lint: every plugin and role page must render;
#   4. antsibull-changelog's lint of the changelog and its fragments.
# The tools live in .venv-release (requirements-release.txt, hashed), apart from the development lock: they pin
# their own ansible-core. Every step runs; the script fails when any did.
set -uo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"
venv="$repo/.venv-release"
version="$(.venv/bin/python -c 'import yaml; print(yaml.safe_load(open("galaxy.yml"))["version"])')"
tarball="$repo/build/gpufleet-fleet-$version.tar.gz"
[ -f "$tarball" ] || { echo "release-check: $tarball does not exist: run \`make collection\`" >&2; exit 2; }
if [ ! -x "$venv/bin/python" ] || [ requirements-release.txt -nt "$venv/.installed" ]; then
  python3 -m venv "$venv" && "$venv/bin/python" -m pip install --quiet --require-hashes -r requirements-release.txt \
    && touch "$venv/.installed" || exit 2
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
failed=()

echo "=== galaxy-importer"
printf '[galaxy-importer]\nRUN_ANSIBLE_TEST = False\nRUN_ANSIBLE_LINT = True\n' > "$work/galaxy-importer.cfg"
# Its warnings are shown (the sanity ignores the collection ships are one: Galaxy counts them); an error fails.
# (In the scratch directory: it writes importer_result.json where it runs.)
(cd "$work" && GALAXY_IMPORTER_CONFIG="$work/galaxy-importer.cfg" PATH="$venv/bin:$PATH" \
  "$venv/bin/python" -m galaxy_importer.main "$tarball" > "$work/importer.log" 2>&1) || failed+=(galaxy-importer)
grep -v "^Loading" "$work/importer.log"
grep -q "^ERROR" "$work/importer.log" && failed+=(galaxy-importer)

echo "=== ansible-test sanity on the tarball"
SANITY_TARBALL="$tarball" scripts/sanity.sh || failed+=("ansible-test sanity")

echo "=== antsibull-docs lint-collection-docs"
collection="$work/collections/ansible_collections/gpufleet/fleet"
mkdir -p "$collection" && tar -xzf "$tarball" -C "$collection"
(cd "$collection" && ANSIBLE_COLLECTIONS_PATH="$work/collections" PATH="$venv/bin:$PATH" \
  "$venv/bin/antsibull-docs" lint-collection-docs --plugin-docs --skip-rstcheck .) || failed+=(antsibull-docs)

echo "=== antsibull-changelog lint"
# The released changelog (changelogs/changelog.yaml) and the fragments waiting for the next release.
PATH="$venv/bin:$PATH" "$venv/bin/antsibull-changelog" lint || failed+=(antsibull-changelog)

if [ "${#failed[@]}" -gt 0 ]; then
  echo "release-check: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "release-check: the collection tarball passed galaxy-importer, ansible-test sanity, antsibull-docs and antsibull-changelog"
