#!/usr/bin/env bash
# Serves a small random-weight Qwen2 with vLLM on this machine's GPU through gpufleet's own pieces, and
# writes what each step returned to OUTDIR:
#   1. a venv on top of BASE_PYTHON's packages (torch) with the wheels of WHEELHOUSE installed (vLLM, its
#      missing dependencies, ansible-core), no index, no resolution;
#   2. a Qwen2 with real head sizes and a byte-level BPE tokenizer generated here (seeded random weights),
#      packed as a tarball and staged by the model_store role (playbooks/model.yml, run twice: the second
#      run must change nothing);
#   3. the vllm_service role's own templates (unit, instance drop-in, env file) rendered with the role's
#      defaults and vars for one instance on the GPUs of GPUS (tensor parallel over them), into OUTDIR
#      instead of /etc;
#   4. vLLM started with exactly the drop-in's ExecStart= and the env file's variables (env -i, as systemd
#      would), then openai_probe's health wait (time to healthy), torch_stack_info on the venv, the role's
#      warm-up classes twice (first vs steady state) and the GPU's memory after warm-up (nvidia_gpu_info,
#      nvidia-smi), and the raw answers of /v1/models and /v1/completions for the unit tests.
# The instance declares one environment variable, PATH (below: the role's env file sets none). It writes only
# under a temporary directory and OUTDIR, and stops vLLM at the end.
#   usage: [GPUS=0,1] scripts/verify-local-vllm.sh WHEELHOUSE OUTDIR [BASE_PYTHON]
# TIME_TO_SERVING=1: after the first (cold) start, two more, timed like it (healthy, then the first completion):
# a restart on the caches the first left in the instance's home, and a start in an empty home at the same path (the
# built one moved aside), as a second node of the fleet has it, given those caches packed, verified and installed by
# the vllm_service role's compile-cache code; each start's phases are read from vLLM's log with
# plugin_utils/vllm_start.py into OUTDIR/time-to-serving.json (issue 33's figures). The same path matters: vLLM's
# compile-cache hash and flashinfer's JIT builds depend on the home's path (seen on an H100: both built again in a
# home of another path).
# GPUS (default 0): the instance's GPU indexes; with more than one, tensor_parallel_size is their count and NCCL
# logs its set-up (NCCL_DEBUG=INFO: the interface its bootstrap and socket transport use, the P2P paths).
# WHEELHOUSE holds the wheels of tests/fixtures/h200-real/vllm_wheelhouse.txt that BASE_PYTHON lacks
# (pip download --no-deps --only-binary=:all: for its Python and platform); BASE_PYTHON holds torch.
# VENV=DIR: serve from that venv as it is (one the inference_venv role built: scripts/verify-local-venv.sh)
# instead of layering one on BASE_PYTHON; WHEELHOUSE is then not read.
set -uo pipefail

wheelhouse="$(realpath "$1")" outdir="$(realpath -m "$2")" base_python="${3:-python3}"
base_bin="$(dirname "$(command -v "$base_python")")"
cd "$(dirname "$0")/.."
repo="$PWD"
mkdir -p "$outdir"
work="$(mktemp -d)"
venv="$work/venv" models="$work/models" home="$work/home" port=8000
gpus="${GPUS:-0}"
gpu_count="$(tr ',' '\n' <<<"$gpus" | grep -c .)"
instance="gpu${gpus//,/-}"
export ANSIBLE_CONFIG="$repo/ansible.cfg" LC_ALL=C.UTF-8
# One JSON document per task result, so the files can be compared and kept as fixtures.
export ANSIBLE_STDOUT_CALLBACK=minimal ANSIBLE_CALLBACK_RESULT_FORMAT=json ANSIBLE_LOAD_CALLBACK_PLUGINS=1
export ANSIBLE_LOCALHOST_WARNING=false ANSIBLE_INVENTORY_UNPARSED_WARNING=false
vllm_pid=""

run() {
  local name="$1"; shift
  echo "=== $name: $*"
  "$@" >"$outdir/$name.txt" 2>&1
  local rc=$?
  echo "rc=$rc" >>"$outdir/$name.txt"
  tail -n 40 "$outdir/$name.txt"
  return $rc
}

stop_vllm() {
  [ -n "$vllm_pid" ] || return 0
  # vLLM's engine core is a child process: stop the whole session, as systemd's KillSignal=SIGTERM would.
  kill -TERM -- "-$vllm_pid" 2>/dev/null
  for _ in $(seq 60); do kill -0 "$vllm_pid" 2>/dev/null || break; sleep 1; done
  kill -KILL -- "-$vllm_pid" 2>/dev/null
  vllm_pid=""
}
trap 'stop_vllm; rm -rf "$work"' EXIT

# --- 1. the venv -----------------------------------------------------------------------------------------
make_venv() {
  "$base_python" -m venv --without-pip "$venv" || return 1
  local site
  site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" || return 1
  # The base's own packages (torch and what the machine's image holds) stay visible, below the venv's.
  "$base_python" -c 'import site; print("\n".join(site.getsitepackages()))' >"$site/_gpufleet_base.pth" || return 1
  "$base_python" -m pip --python "$venv/bin/python" install --quiet --no-index --no-deps --no-compile \
    --disable-pip-version-check "$wheelhouse"/*.whl || return 1
  "$venv/bin/python" -c 'import torch, vllm, ansible; print("torch", torch.__version__, "cuda", torch.version.cuda, "vllm", vllm.__version__, "ansible-core", ansible.__version__ if hasattr(ansible, "__version__") else "")'
}
if [ -n "${VENV:-}" ]; then
  venv="$(realpath "$VENV")" base_bin="$venv/bin"
  run venv "$venv/bin/python" -c 'import torch, vllm; print("torch", torch.__version__, "cuda", torch.version.cuda, "vllm", vllm.__version__)' || exit 1
else
  run venv make_venv || exit 1
fi
export PATH="$venv/bin:$PATH"
python="$venv/bin/python"
ansible_local=(ansible localhost -i localhost, -c local -e "ansible_python_interpreter=$python")

cat >"$work/hosts.yml" <<HOSTS
gpu_nodes:
  hosts:
    localhost:
      ansible_connection: local
      ansible_python_interpreter: $python
      # Already root here (or the owner of every path used): no sudo to become through.
      ansible_become: false
HOSTS

# --- 2. the model, staged by model_store -----------------------------------------------------------------
run model-build env PYTHONPATH="$repo/lab/builders" PYTHONHASHSEED=0 TOKENIZERS_PARALLELISM=false \
  "$python" - "$work/tiny-qwen2-gpu.tar.gz" <<'PY' || exit 1
"""A Qwen2 of real head sizes (head_dim 64, grouped-query attention) with the lab's tokenizer corpus."""
import sys
import tempfile
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from make_tiny_model import CHAT_TEMPLATE, SEED, SPECIAL_TOKENS, VOCAB_SIZE, corpus_lines, write_reproducible_tarball

with tempfile.TemporaryDirectory() as work:
    model_dir = Path(work) / "model"
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(corpus_lines(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<|endoftext|>", eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", unk_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(model_dir)
    torch.manual_seed(SEED)
    config = Qwen2Config(vocab_size=tokenizer.get_vocab_size(), hidden_size=1024, intermediate_size=2816,
                         num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=4, head_dim=64,
                         max_position_embeddings=4096, tie_word_embeddings=True,
                         bos_token_id=tokenizer.token_to_id("<|endoftext|>"),
                         eos_token_id=tokenizer.token_to_id("<|im_end|>"), dtype="bfloat16")
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(model_dir, safe_serialization=True)
    print("parameters", sum(p.numel() for p in model.parameters()), "files", sorted(p.name for p in model_dir.iterdir()))
    write_reproducible_tarball(model_dir, Path(sys.argv[1]))
PY
model_sha256="$(sha256sum "$work/tiny-qwen2-gpu.tar.gz" | cut -d' ' -f1)"
cat >"$work/model-vars.json" <<VARS
{"model_store_root": "$models", "model_store_owner": "root", "model_store_group": "root",
 "model_store_models": [{"name": "tiny-qwen2-gpu", "sha256": "$model_sha256",
                         "shared_path": "$work/tiny-qwen2-gpu.tar.gz"}]}
VARS
model_playbook=(ansible-playbook -i "$work/hosts.yml" -e "@$work/model-vars.json" playbooks/model.yml)
run model-stage "${model_playbook[@]}" || exit 1
run model-stage-rerun "${model_playbook[@]}" || exit 1

# --- 3. the role's templates, rendered for one instance on GPUS ------------------------------------------
api_key="$("$python" -c 'import secrets; print(secrets.token_hex(16))')"
# systemd's default PATH lacks the venv's bin (and here the base's, which the venv is layered on), where
# flashinfer's JIT build of vLLM's sampler finds ninja; the role's env file sets no PATH, so without this the
# engine fails at warm-up with "No such file or directory: 'ninja'" (seen on the H200).
instance_env="{\"PATH\": \"$venv/bin:$base_bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\"}"
# A systemd service sees ldconfig's paths only: if libcuda is reachable through LD_LIBRARY_PATH alone here,
# the instance must be given it through the role's own per-instance environment.
if ! ldconfig -p | grep -q 'libcuda\.so\.1 ' && [ -n "${LD_LIBRARY_PATH:-}" ]; then
  instance_env="${instance_env%\}}, \"LD_LIBRARY_PATH\": \"$LD_LIBRARY_PATH\"}"
fi
if [ "$gpu_count" -gt 1 ]; then
  instance_env="${instance_env%\}}, \"NCCL_DEBUG\": \"INFO\", \"NCCL_DEBUG_SUBSYS\": \"INIT,NET\"}"
fi
cat >"$work/serve-vars.json" <<VARS
{"vllm_service_venv": "$venv", "vllm_service_api_key": "$api_key", "vllm_service_home": "$home",
 "vllm_service_config_dir": "$outdir/rendered", "vllm_service_prune": false,
 "vllm_service_instances": [{"name": "$instance", "model": "$models/tiny-qwen2-gpu", "port": $port,
                             "gpus": [$gpus], "tensor_parallel_size": $gpu_count, "env": $instance_env}]}
VARS
cat >"$work/render.yml" <<PLAY
# The role's own template tasks' sources, defaults and vars; only the destinations differ (OUTDIR, not /etc).
- name: Render vllm_service's unit, drop-in and environment file
  hosts: gpu_nodes
  # The role runs with the node's facts (memory limits derive from them).
  gather_facts: true
  vars_files:
    - $repo/roles/vllm_service/defaults/main.yml
    - $repo/roles/vllm_service/vars/main.yml
  tasks:
    - name: Render the vllm@ template unit
      ansible.builtin.template:
        src: $repo/roles/vllm_service/templates/etc/systemd/system/vllm@.service.j2
        dest: $outdir/rendered/vllm@.service
        mode: "0644"
    - name: Render each instance's drop-in and environment file
      ansible.builtin.template:
        src: "$repo/roles/vllm_service/templates/{{ item.1 }}.j2"
        dest: "$outdir/rendered/{{ vllm_service_instance.name }}.{{ item.1 | basename }}"
        mode: "0600"
      loop: "{{ __vllm_service_instances | product(['etc/systemd/system/vllm@.service.d/gpufleet.conf', 'etc/vllm/instance.env']) | list }}"
      loop_control:
        label: "{{ item.1 }}"
      vars:
        vllm_service_instance: "{{ item.0 }}"
PLAY
mkdir -p "$outdir/rendered" "$home"
run render ansible-playbook -i "$work/hosts.yml" -e "@$work/serve-vars.json" "$work/render.yml" || exit 1
if git -C "$repo" rev-parse --git-dir >/dev/null 2>&1; then
  run render-commit git -C "$repo" log -1 --format='%H %cI %s' -- roles/vllm_service
fi

# ExecStart= as systemd splits it (double quotes, backslash escapes, %% and $$), and the env file as
# systemd's EnvironmentFile= reads it; the service's own environment is systemd's PATH and the account's HOME.
"$python" - "$outdir/rendered/$instance.gpufleet.conf" "$outdir/rendered/$instance.instance.env" "$home" "$work" <<'PY' || exit 1
import json
import re
import shlex
import sys
from pathlib import Path

dropin, envfile, home, work = sys.argv[1:5]
lines = [line for line in Path(dropin).read_text().splitlines() if line.startswith("ExecStart=") and line != "ExecStart="]
argv = [re.sub(r"([%$])\1", r"\1", word) for word in shlex.split(lines[-1][len("ExecStart="):])]
# The unit's own Environment= lines: the home, and Inductor's and Triton's caches inside it.
env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": home,
       "TORCHINDUCTOR_CACHE_DIR": f"{home}/.cache/torchinductor", "TRITON_CACHE_DIR": f"{home}/.cache/triton"}
for line in Path(envfile).read_text().splitlines():
    if line.strip() and not line.lstrip().startswith("#"):
        key, _, value = line.partition("=")
        env[key.strip()] = shlex.split(value)[0] if value else ""
Path(work, "argv.nul").write_bytes(b"".join(word.encode() + b"\0" for word in argv))
Path(work, "env.nul").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))
print(json.dumps({"argv": argv, "env": sorted(env)}, indent=1))
PY
mapfile -d '' argv <"$work/argv.nul"
mapfile -d '' service_env <"$work/env.nul"
# The device rules of a shared GPU host (NVLink multicast off) travel into the service's environment too.
for name in NCCL_NVLS_ENABLE TORCH_SYMM_MEM_DISABLE_MULTICAST NVSHMEM_DISABLE_NVLS; do
  [ -n "${!name:-}" ] && service_env+=("$name=${!name}")
done

# --- 4. vLLM, probed ---------------------------------------------------------------------------------------
auth=(-H "Authorization: Bearer $api_key" -H 'Content-Type: application/json')
# start_vllm NAME: vLLM started as the unit would, waited for until healthy (NAME-health.txt), then one completion
# timed from its request (NAME-first-completion.txt); vLLM's own output is in NAME.log.
start_vllm() {
  local name="$1"
  echo "=== $name: env -i <${#service_env[@]} variables> ${argv[*]}"
  local started; started="$(date +%s.%N)"
  (cd "$home" && exec setsid env -i "${service_env[@]}" "${argv[@]}") >"$outdir/$name.log" 2>&1 &
  vllm_pid=$!
  "${ansible_local[@]}" -m gpufleet.fleet.openai_probe \
    -a "{\"url\": \"http://127.0.0.1:$port\", \"api_key\": \"$api_key\", \"health_timeout\": 900, \"health_interval\": 1, \"expect_models\": [\"$instance\"]}" \
    >"$outdir/$name-health.txt" 2>&1 &
  local probe_pid=$!
  # A server that dies is not waited for until the probe's timeout.
  while kill -0 "$probe_pid" 2>/dev/null; do
    kill -0 "$vllm_pid" 2>/dev/null || { kill "$probe_pid"; echo "vLLM exited before it was healthy"; }
    sleep 1
  done
  wait "$probe_pid"; local health_rc=$?
  local healthy; healthy="$(date +%s.%N)"
  echo "rc=$health_rc since_start_s=$("$python" -c "print(round($healthy - $started, 2))")" >>"$outdir/$name-health.txt"
  cat "$outdir/$name-health.txt"
  if [ "$health_rc" -ne 0 ]; then tail -n 80 "$outdir/$name.log"; return 1; fi
  curl -sS -o /dev/null -w 'http=%{http_code} first_completion_s=%{time_total}\n' "${auth[@]}" \
    "http://127.0.0.1:$port/v1/completions" \
    -d "{\"model\": \"$instance\", \"prompt\": \"hello world\", \"max_tokens\": 8, \"temperature\": 0}" \
    | tee "$outdir/$name-first-completion.txt"
}
start_vllm vllm || exit 1
cp "$outdir/vllm-health.txt" "$outdir/health.txt"

run torch_stack_info "${ansible_local[@]}" -m gpufleet.fleet.torch_stack_info \
  -a "{\"venv\": \"$venv\", \"gpu_compute\": true, \"import_check\": [\"vllm._C_stable_libtorch\", \"vllm.vllm_flash_attn._vllm_fa3_C\", \"vllm.cumem_allocator\"]}"

warmup_args() {
  "$python" -c '
import json, sys, yaml
defaults = yaml.safe_load(open(sys.argv[1]))
print(json.dumps({"url": "http://127.0.0.1:" + sys.argv[2], "api_key": sys.argv[3], "health_path": "",
                  "timeout": defaults["vllm_service_warmup_request_timeout"], "model": sys.argv[4],
                  "requests": defaults["vllm_service_warmup_requests"]}))' \
    roles/vllm_service/defaults/main.yml "$port" "$api_key" "$instance"
}
run warmup "${ansible_local[@]}" -m gpufleet.fleet.openai_probe -a "$(warmup_args)"
run steady "${ansible_local[@]}" -m gpufleet.fleet.openai_probe -a "$(warmup_args)"
run nvidia_gpu_info "${ansible_local[@]}" -m gpufleet.fleet.nvidia_gpu_info
# The role's own check after warm-up (vllm_service's warmup.yml), given the instance's processes: the unit's
# cgroup here is vLLM's process session.
gpu_memory_args() {
  "$python" -c '
import json, sys, yaml
defaults = yaml.safe_load(open(sys.argv[1]))
print(json.dumps({"instances": [{"name": sys.argv[2], "gpus": [int(g) for g in sys.argv[3].split(",")],
                                 "gpu_memory_utilization": defaults["vllm_service_instance_defaults"]["gpu_memory_utilization"],
                                 "pids": [int(p) for p in sys.argv[4].split()]}],
                  "tolerance": defaults["vllm_service_gpu_memory_tolerance"]}))' \
    roles/vllm_service/defaults/main.yml "$instance" "$gpus" "$(pgrep -s "$vllm_pid" | tr '\n' ' ')"
}
run gpu_memory_check "${ansible_local[@]}" -M roles/vllm_service/library -m vllm_gpu_memory -a "$(gpu_memory_args)"
run nvidia-smi-apps nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv
run nvidia-smi-memory nvidia-smi --query-gpu=memory.used,memory.total,memory.reserved --format=csv

# Raw answers, for the unit tests that hold the probe's parsing to what vLLM really sends.
curl -sS "${auth[@]}" "http://127.0.0.1:$port/v1/models" >"$outdir/response-models.json"
curl -sS "${auth[@]}" "http://127.0.0.1:$port/v1/completions" \
  -d "{\"model\": \"$instance\", \"prompt\": \"hello world\", \"max_tokens\": 8, \"temperature\": 0}" \
  >"$outdir/response-completion.json"
curl -sS -N "${auth[@]}" "http://127.0.0.1:$port/v1/completions" \
  -d "{\"model\": \"$instance\", \"prompt\": \"hello world\", \"max_tokens\": 4, \"stream\": true, \"stream_options\": {\"include_usage\": true}}" \
  >"$outdir/response-completion-stream.txt"
curl -sS -o /dev/null -w '%{http_code}\n' "http://127.0.0.1:$port/v1/models" >"$outdir/response-models-no-key.txt"
curl -sS "http://127.0.0.1:$port/metrics" | grep -E '^vllm:(kv_cache_usage_perc|num_requests|prompt_tokens_total|generation_tokens_total)' >"$outdir/metrics.txt"
stop_vllm
echo "=== vLLM stopped; its log: $outdir/vllm.log"
grep -E 'non-default args|Available KV cache memory|GPU KV cache size|Maximum concurrency|init engine|Model loading took|torch.compile takes|Graph capturing finished|Using .* backend|NCCL INFO (Bootstrap|NET/Socket|Using network)' "$outdir/vllm.log"

# The figures: time to healthy, first (warm-up) vs steady-state latency, tokens/s, GPU memory vs the share.
"$python" - "$outdir" "$work/serve-vars.json" roles/vllm_service/defaults/main.yml <<'PY' | tee "$outdir/summary.json"
import json
import re
import sys
from pathlib import Path

import yaml

outdir = Path(sys.argv[1])
instance = json.loads(Path(sys.argv[2]).read_text())["vllm_service_instances"][0]
share = instance.get("gpu_memory_utilization", yaml.safe_load(Path(sys.argv[3]).read_text())["vllm_service_instance_defaults"]["gpu_memory_utilization"])


def result(name):
    text = (outdir / f"{name}.txt").read_text()
    return json.loads(text.split("=>", 1)[1].rsplit("\nrc=", 1)[0])


def classes(name):
    return {entry["name"]: {key: entry[key] for key in ("succeeded", "count", "concurrency", "latency_s", "wall_s",
                                                        "prompt_tokens", "completion_tokens", "completion_tokens_per_s")}
            for entry in result(name)["results"]}


health = result("health")["health"]
since_start = float(re.search(r"since_start_s=([0-9.]+)", (outdir / "health.txt").read_text()).group(1))
# One row per GPU of the machine: the instance's are the first len(gpus) (vLLM sees them as 0..n-1).
memory_rows = [row for row in (outdir / "nvidia-smi-memory.txt").read_text().splitlines()[1:] if "MiB" in row]
used, total = zip(*([int(field.split()[0]) for field in row.split(",")[:2]] for row in memory_rows[:len(instance["gpus"])]))
log = (outdir / "vllm.log").read_text(errors="replace")
kv = re.search(r"Available KV cache memory: ([0-9.]+) GiB", log)
# NCCL's set-up (NCCL_DEBUG=INFO with more than one GPU): the interfaces of its bootstrap and socket transport.
nccl = sorted({line.split("NCCL INFO ", 1)[1].strip() for line in log.splitlines()
               if re.search(r"NCCL INFO (Bootstrap|NET/Socket|NET/IB|Using network|NCCL_SOCKET_IFNAME)", line)})
print(json.dumps({
    "model_stage_changed": [(outdir / f"{name}.txt").read_text().count('"changed": true')
                            for name in ("model-stage", "model-stage-rerun")],
    "time_to_healthy_s": since_start, "health_probe_waited_s": health["waited_s"],
    "warmup": classes("warmup"), "steady": classes("steady"),
    "gpus": instance["gpus"], "tensor_parallel_size": instance["tensor_parallel_size"],
    "gpu_memory_used_mib": list(used), "gpu_memory_total_mib": list(total),
    "gpu_memory_used_share": [round(u / t, 4) for u, t in zip(used, total)],
    "gpu_memory_utilization": share, "kv_cache_gib": float(kv.group(1)) if kv else None, "nccl": nccl,
}, indent=1))
PY

# --- 5. time to serving (TIME_TO_SERVING=1) ---------------------------------------------------------------
[ "${TIME_TO_SERVING:-0}" = 1 ] || exit 0
start_vllm vllm-restart || exit 1
stop_vllm
# The role's pack on the node that built the caches, its verify-and-install on a second node: here the built home
# is moved aside and an empty one made at its path.
run compile-cache-ship env PYTHONPATH="$repo/collections" "$python" - "$home" "$work/compile-cache.tar" <<'PY' || exit 1
import json
import os
import sys

import torch
import vllm

from ansible_collections.gpufleet.fleet.plugins.module_utils import compile_cache

home, archive = sys.argv[1:3]
components = {"torch": torch.__version__, "vllm": vllm.__version__, "gpu": torch.cuda.get_device_name(0)}
key = compile_cache.cache_key(components)
packed = compile_cache.pack(home, key, components, archive)
os.rename(home, home + "-built")
os.mkdir(home)
installed = compile_cache.install(packed["archive"], packed["sha256"], key, home)
print(json.dumps({"key": key, "sha256": packed["sha256"], "size": packed["size"], "installed": installed}))
PY
start_vllm vllm-shipped || exit 1
stop_vllm
PYTHONPATH="$repo/collections" "$python" - "$outdir" <<'PY' | tee "$outdir/time-to-serving.json"
import json
import re
import sys
from pathlib import Path

from ansible_collections.gpufleet.fleet.plugins.plugin_utils.vllm_start import start_phases

outdir = Path(sys.argv[1])
shipped = json.loads((outdir / "compile-cache-ship.txt").read_text().split("\nrc=")[0].strip().splitlines()[-1])
starts = {}
for label, name in (("(a) cold", "vllm"), ("(b) restart", "vllm-restart"), ("(c) shipped", "vllm-shipped")):
    health = (outdir / f"{name}-health.txt").read_text()
    completion = (outdir / f"{name}-first-completion.txt").read_text()
    healthy = float(re.search(r"since_start_s=([0-9.]+)", health).group(1))
    first = float(re.search(r"first_completion_s=([0-9.]+)", completion).group(1))
    starts[label] = {"healthy_s": healthy, "first_completion_s": round(healthy + first, 2),
                     "phases": start_phases((outdir / f"{name}.log").read_text(errors="replace")).as_dict()}
ratio = starts["(c) shipped"]["healthy_s"] / starts["(b) restart"]["healthy_s"]
print(json.dumps({"shipped_cache": shipped, "starts": starts, "shipped_over_restart": round(ratio, 3)}, indent=1))
PY
