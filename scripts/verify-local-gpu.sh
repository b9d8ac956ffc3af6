#!/usr/bin/env bash
# Reads this machine's GPU stack with gpufleet's read-only modules over a local connection and checks the
# declared stack, writing each result to OUTDIR. Used to prove the modules on real hardware.
#   usage: scripts/verify-local-gpu.sh VENV STACK_FILE OUTDIR [GPU_EXPECT_JSON]
set -uo pipefail

venv="$1" stack="$2" outdir="$3" gpu_expect="${4:-}"
cd "$(dirname "$0")/.."
mkdir -p "$outdir"
export ANSIBLE_CONFIG="$PWD/ansible.cfg" LC_ALL=C.UTF-8
# One JSON document per task result, so the files can be compared and kept as fixtures.
export ANSIBLE_STDOUT_CALLBACK=minimal ANSIBLE_CALLBACK_RESULT_FORMAT=json ANSIBLE_LOAD_CALLBACK_PLUGINS=1
python="$venv/bin/python"
ansible_local=(ansible localhost -i localhost, -c local -e "ansible_python_interpreter=$python")

run() {
  local name="$1"; shift
  echo "=== $name: $*"
  "$@" >"$outdir/$name.txt" 2>&1
  echo "rc=$?" >>"$outdir/$name.txt"
  cat "$outdir/$name.txt"
}

run nvidia-smi nvidia-smi
run nvidia-smi-query nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total,compute_cap,persistence_mode,ecc.mode.current,pci.bus_id --format=csv
run nvidia_gpu_info "${ansible_local[@]}" -m gpufleet.fleet.nvidia_gpu_info
if [ -n "$gpu_expect" ]; then
  run nvidia_gpu_info_expect "${ansible_local[@]}" -m gpufleet.fleet.nvidia_gpu_info -a "{\"expect\": $gpu_expect}"
fi
run nvidia_gpu_info_check "${ansible_local[@]}" --check -m gpufleet.fleet.nvidia_gpu_info
run torch_stack_info "${ansible_local[@]}" -m gpufleet.fleet.torch_stack_info -a "venv=$venv gpu_compute=true"
run torch_stack_info_check "${ansible_local[@]}" --check -m gpufleet.fleet.torch_stack_info -a "venv=$venv"
run plan python -m gpufleet plan --stack "$stack"
