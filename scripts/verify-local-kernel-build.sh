#!/usr/bin/env bash
# Runs the flash_attn role's CUDA path on this machine over a local connection: builds the CUDA test kernel
# (tests/fixtures/kernel_pkg_cuda) against VENV's torch with CUDA_HOME's nvcc, for the arch list read from
# this machine's GPUs, then runs the role again (it must reuse the build and change nothing) and once in
# check mode, and calls the installed kernel on the GPU. Each step's output goes to OUTDIR.
#   usage: scripts/verify-local-kernel-build.sh VENV CUDA_HOME OUTDIR
set -uo pipefail

venv="$1" cuda_home="$2" outdir="$3"
cd "$(dirname "$0")/.."
mkdir -p "$outdir"
work="$(mktemp -d)"
export ANSIBLE_CONFIG="$PWD/ansible.cfg" LC_ALL=C.UTF-8 GPUFLEET_CACHE="$work/cache"

sdist="$work/gpufleet-kernel-cuda-demo-0.1.0.tar.gz"
PYTHONPATH=lab/builders python3 -c '
import sys
from pathlib import Path
from python_stack import make_kernel_sdist
make_kernel_sdist(Path("tests/fixtures/kernel_pkg_cuda"), "gpufleet-kernel-cuda-demo-0.1.0", Path(sys.argv[1]))
' "$sdist" || exit 1
sha256="$(sha256sum "$sdist" | cut -d' ' -f1)"

cat >"$work/hosts.yml" <<HOSTS
gpu_nodes:
  hosts:
    localhost:
      ansible_connection: local
      ansible_python_interpreter: $venv/bin/python
      # Already root here: no sudo to become through.
      ansible_become: false
HOSTS
cat >"$work/vars.json" <<VARS
{"flash_attn_venv": "$venv", "flash_attn_cuda_home": "$cuda_home",
 "flash_attn_node_build_dir": "$work/build", "flash_attn_node_cache": "$work/node-cache",
 "flash_attn_packages": [{"name": "gpufleet-kernel-cuda-demo", "version": "0.1.0", "path": "$sdist",
                          "sha256": "$sha256", "import_name": "gpufleet_kernel_cuda_demo"}]}
VARS

run() {
  local name="$1"; shift
  echo "=== $name: $*"
  "$@" >"$outdir/$name.txt" 2>&1
  echo "rc=$?" >>"$outdir/$name.txt"
  tail -n 25 "$outdir/$name.txt"
}

playbook=(ansible-playbook -i "$work/hosts.yml" -e "@$work/vars.json" playbooks/kernels.yml)
run build "${playbook[@]}"
run rerun "${playbook[@]}"
run check "${playbook[@]}" --check --diff
run cache-entry sh -c "cat $GPUFLEET_CACHE/kernels/gpufleet-kernel-cuda-demo/*/key.json"
run kernel-call "$venv/bin/python" -c '
import torch, gpufleet_kernel_cuda_demo as k
a = torch.randn(1 << 20, device="cuda"); b = torch.randn(1 << 20, device="cuda")
out = k.scaled_add(a, b, 0.5)
print("built with torch", k.built_with_torch(), "for arch list", k.arch_list())
print("max error vs torch:", (out - (a + 0.5 * b)).abs().max().item())
'
so="$(find "$venv" -path '*gpufleet_kernel_cuda_demo/_C*.so' | head -n 1)"
run cuobjdump sh -c "cuobjdump --list-elf '$so' 2>&1 || $cuda_home/bin/cuobjdump --list-elf '$so'"
rm -rf "$work"
