#!/usr/bin/env bash
# Runs the drift playbook's driver and gpu_health layers on this machine over a local connection, once with
# the driver version this machine really has and once with another one, writing the console output and the
# report files (JSON, Markdown) of each run to OUTDIR. Used to prove the drift checks on real hardware.
#   usage: scripts/verify-local-drift.sh PYTHON REAL_DRIVER_VERSION OTHER_DRIVER_VERSION OUTDIR
# (OTHER_DRIVER_VERSION: another R580 driver, which runs the stack's CUDA 13.0 too, e.g. 580.95.05)
set -uo pipefail

python="$1" real="$2" other="$3" outdir="$4"
cd "$(dirname "$0")/.."
mkdir -p "$outdir"
work="$(mktemp -d)"
export ANSIBLE_CONFIG="$PWD/ansible.cfg" LC_ALL=C.UTF-8 ANSIBLE_CALLBACKS_ENABLED=gpufleet_drift

cat >"$work/hosts.yml" <<HOSTS
gpu_nodes:
  hosts:
    localhost:
      ansible_connection: local
      ansible_python_interpreter: $python
      ansible_become: false
HOSTS

# A drift run compares and never fetches: the stack names the driver (its runfile's sha256 is a placeholder,
# as nothing is downloaded), and only its version is compared with the node. The CUDA 13.0 torch of the
# device's stack needs an R580 driver: OTHER_DRIVER_VERSION must be one too (e.g. 580.95.05).
placeholder_sha256=0000000000000000000000000000000000000000000000000000000000000000

for name in real other; do
  version="$real"; [ "$name" = other ] && version="$other"
  echo "=== drift, declared driver $version"
  GPUFLEET_DRIFT_REPORT_DIR="$work/$name" GPUFLEET_DRIFT_RUN_ID="device-$name" \
    ansible-playbook --check -i "$work/hosts.yml" playbooks/drift.yml \
    -e "{\"drift_layers\": [\"driver\", \"gpu_health\"], \"gpufleet_mirror_url\": \"http://mirror.invalid\",
         \"gpufleet_stack\": {\"gpu\": \"H200\", \"driver\": \"$version\", \"cuda\": null, \"python\": \"3.12\",
                            \"torch\": \"2.11.0\", \"torch_variant\": \"cu130\", \"vllm\": null},
         \"gpufleet_artifact_sha256\": {\"NVIDIA-Linux-x86_64-$version.run\": \"$placeholder_sha256\"}}" \
    >"$outdir/drift-$name.txt" 2>&1
  echo "rc=$?" >>"$outdir/drift-$name.txt"
  tail -n 30 "$outdir/drift-$name.txt"
  cp "$work/$name/report.json" "$outdir/drift-$name.json" 2>/dev/null
  cp "$work/$name/report.md" "$outdir/drift-$name.md" 2>/dev/null
done
rm -rf "$work"
