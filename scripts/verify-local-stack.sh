#!/usr/bin/env bash
# Runs playbooks/verify.yml (the on-host check of a node against its declared stack) on this machine over a
# local connection: once with the stack this machine really runs, once with a stack that declares another
# driver, writing each run's output to OUTDIR. Used to prove the check on real hardware.
#   usage: scripts/verify-local-stack.sh VENV STACK_FILE OTHER_DRIVER_VERSION OUTDIR
# VENV is the venv whose torch the node serves with (it stands for the venv in service); STACK_FILE is the
# stack this machine runs (stacks/h200-device.yml on the H200 machine).
set -uo pipefail

venv="$1" stack="$2" other="$3" outdir="$4"
cd "$(dirname "$0")/.."
mkdir -p "$outdir"
work="$(mktemp -d)"
export ANSIBLE_CONFIG="$PWD/ansible.cfg" LC_ALL=C.UTF-8
# The venv in service is <inference_venv_root>/current.
mkdir -p "$work/venvs" && ln -s "$venv" "$work/venvs/current"

cat >"$work/hosts.yml" <<HOSTS
gpu_nodes:
  hosts:
    localhost:
      ansible_connection: local
      ansible_python_interpreter: $venv/bin/python
      # Already root here: no sudo to become through.
      ansible_become: false
      inference_venv_root: $work/venvs
      cuda_toolkit_link: /usr/local/cuda
      # Nothing is fetched: the mirror and the driver runfile's sha256 are placeholders.
      gpufleet_mirror_url: http://mirror.invalid
HOSTS

stack_json() {  # the stack file as JSON, with the driver replaced when $1 is given
  "$venv/bin/python" - "$stack" "${1:-}" <<'PY'
import json, sys, yaml
stack = yaml.safe_load(open(sys.argv[1]))
if sys.argv[2]:
    stack["driver"] = sys.argv[2]
print(json.dumps({"gpufleet_stack": stack, "gpufleet_artifact_sha256": {
    "NVIDIA-Linux-x86_64-%s.run" % stack["driver"]: "0" * 64}}))
PY
}

for name in declared other; do
  driver=""; [ "$name" = other ] && driver="$other"
  stack_json "$driver" >"$work/$name.json"
  echo "=== verify.yml, stack $(cat "$work/$name.json")"
  ansible-playbook -i "$work/hosts.yml" -e "@$work/$name.json" playbooks/verify.yml >"$outdir/verify-$name.txt" 2>&1
  echo "rc=$?" >>"$outdir/verify-$name.txt"
  tail -n 40 "$outdir/verify-$name.txt"
done
rm -rf "$work"
