#!/usr/bin/env bash
# Builds the serving venv on this machine with the inference_venv role itself, from a wheelhouse and lock made
# here, and writes what each step returned to OUTDIR (issue 38, part 1):
#   1. scripts/wheelhouse-from-installed.py: the carried wheels (WHEELS: vLLM, what it needs beyond the
#      machine's image, ansible-core) plus every installed distribution of BASE_PYTHON's environment they need
#      (torch of the machine's CUDA variant and its nvidia-* libraries), repacked, and their lock;
#   2. a bootstrap venv with ansible-core (layered on BASE_PYTHON) that runs the role;
#   3. the inference_venv role (playbooks' own role, its own tasks: lock check, pip_lock install with
#      --require-hashes from the wheelhouse, torch_stack_info probe with CUDA expected, switch to current),
#      twice: the second run must change nothing;
#   4. torch_stack_info with gpu_compute on the venv in service.
# The venv stays at WORKDIR/venvs/current for scripts/verify-local-vllm.sh (VENV=...).
#   usage: scripts/verify-local-venv.sh WHEELS OUTDIR WORKDIR [BASE_PYTHON] [STACK_FILE] [STACK_ID]
# STACK_FILE (default stacks/h200-vllm.yml) is the host's gpufleet_stack; STACK_ID names the lock and venv.
set -uo pipefail

wheels="$(realpath "$1")" outdir="$(realpath -m "$2")" work="$(realpath -m "$3")"
base_python="${4:-python3}" stack_file="$(realpath "${5:-stacks/h200-vllm.yml}")" stack_id="${6:-h200-vllm-cu130}"
cd "$(dirname "$0")/.."
mkdir -p "$outdir" "$work"
export ANSIBLE_CONFIG="$PWD/ansible.cfg" LC_ALL=C.UTF-8
export ANSIBLE_STDOUT_CALLBACK=minimal ANSIBLE_CALLBACK_RESULT_FORMAT=json ANSIBLE_LOAD_CALLBACK_PLUGINS=1
export ANSIBLE_LOCALHOST_WARNING=false ANSIBLE_INVENTORY_UNPARSED_WARNING=false

run() {
  local name="$1"; shift
  echo "=== $name: $*"
  local started; started="$(date +%s.%N)"
  "$@" >"$outdir/$name.txt" 2>&1
  local rc=$?
  echo "rc=$rc seconds=$(python3 -c "print(round($(date +%s.%N) - $started, 1))")" >>"$outdir/$name.txt"
  tail -n 25 "$outdir/$name.txt"
  return $rc
}

python_version="$("$base_python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
# The venv is made from the real interpreter, not from BASE_PYTHON's own venv.
interpreter="$("$base_python" -c 'import os, sys; print(os.path.realpath(sys._base_executable))')"

# --- 1. the wheelhouse and its lock ----------------------------------------------------------------------
rm -rf "$work/wheelhouse"
run wheelhouse "$base_python" scripts/wheelhouse-from-installed.py "$wheels" "$work/wheelhouse" "$stack_id" "$python_version" || exit 1
du -sh "$work/wheelhouse" | tee -a "$outdir/wheelhouse.txt"
cp "$work/wheelhouse/$stack_id.lock" "$outdir/lock.txt"

# --- 2. ansible-core to run the role ---------------------------------------------------------------------
bootstrap() {
  rm -rf "$work/ansible"
  "$base_python" -m venv --without-pip "$work/ansible" || return 1
  local site
  site="$("$work/ansible/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" || return 1
  "$base_python" -c 'import site; print("\n".join(site.getsitepackages()))' >"$site/_gpufleet_base.pth" || return 1
  "$base_python" -m pip --python "$work/ansible/bin/python" install --quiet --no-index --no-deps --no-compile \
    --ignore-installed --disable-pip-version-check "$wheels"/ansible_core-*.whl "$wheels"/resolvelib-*.whl || return 1
  "$work/ansible/bin/ansible" --version
}
run bootstrap bootstrap || exit 1
export PATH="$work/ansible/bin:$PATH"

# --- 3. the role, twice ------------------------------------------------------------------------------------
cat >"$work/hosts.yml" <<HOSTS
gpu_nodes:
  hosts:
    localhost:
      ansible_connection: local
      ansible_python_interpreter: $work/ansible/bin/python
      # Already root here: no sudo to become through.
      ansible_become: false
HOSTS
# The host's declared stack (the role's argument specs read it; nothing is fetched, so the artifacts' sha256
# are placeholders), and the lock's id for the venv.
"$work/ansible/bin/python" - "$stack_file" >"$work/stack.json" <<'PY' || exit 1
import json, sys, yaml
stack = yaml.safe_load(open(sys.argv[1]))
placeholders = {"NVIDIA-Linux-x86_64-%s.run" % stack["driver"]: "0" * 64}
if stack.get("flash_attn"):
    placeholders["flash_attn-%s.tar.gz" % stack["flash_attn"]] = "0" * 64
print(json.dumps({"gpufleet_stack": stack, "gpufleet_mirror_url": "http://mirror.invalid",
                  "gpufleet_artifact_sha256": placeholders}))
PY
cat >"$work/venv-vars.json" <<VARS
{"inference_venv_stack": {"id": "$stack_id", "python": "$python_version"},
 "inference_venv_python": "$interpreter", "inference_venv_root": "$work/venvs",
 "inference_venv_lock_file": "$work/wheelhouse/$stack_id.lock", "inference_venv_find_links": "file://$work/wheelhouse/",
 "inference_venv_verify_expect": {"cuda_available": true},
 "inference_venv_verify_imports": ["vllm.entrypoints.openai.api_server", "vllm._C_stable_libtorch"]}
VARS
cat >"$work/venv.yml" <<PLAY
- name: Build the serving venv with the inference_venv role
  hosts: gpu_nodes
  gather_facts: false
  tasks:
    - name: Converge the venv
      ansible.builtin.include_role:
        name: inference_venv
PLAY
venv_playbook=(ansible-playbook -i "$work/hosts.yml" -e "@$work/stack.json" -e "@$work/venv-vars.json" "$work/venv.yml")
run role "${venv_playbook[@]}" || exit 1
run role-rerun "${venv_playbook[@]}" || exit 1
grep -h '"changed": true' "$outdir/role-rerun.txt" && echo "the second run changed something" >>"$outdir/role-rerun.txt"

# --- 4. the venv in service, on the GPU ------------------------------------------------------------------
venv="$(realpath "$work/venvs/current")"
run torch_stack_info ansible localhost -i localhost, -c local -e "ansible_python_interpreter=$work/ansible/bin/python" \
  -m gpufleet.fleet.torch_stack_info -a "{\"venv\": \"$venv\", \"gpu_compute\": true}"
du -sh "$venv" | tee "$outdir/venv-size.txt"
echo "venv in service: $venv"
