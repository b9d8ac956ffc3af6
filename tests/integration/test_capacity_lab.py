"""The capacity planner held to vLLM's own numbers on the lab (issue 34): the KV-cache size in tokens and the
maximum concurrency vLLM's CPU build logs at start, against what `gpufleet plan` predicted before any host was
touched, for the instances the lab serves and (slow) for real published shapes started with dummy weights."""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path

import pytest
from conftest import BIN, AnsibleRunner

from ansible_collections.gpufleet.fleet.plugins.plugin_utils.capacity import GiB, predict_fixed_space
from ansible_collections.gpufleet.fleet.plugins.plugin_utils.instance_capacity import logged_kv_cache
from ansible_collections.gpufleet.fleet.plugins.plugin_utils.model_shape import read_model_dir, shape_from_config
from gpufleet import PROJECT_ROOT

TOLERANCE = 0.05
CONFIGS = PROJECT_ROOT / "tests" / "fixtures" / "model_configs"
# Real published shapes small enough for a lab node's memory and cores with dummy weights: (fixture directory,
# max_model_len). Each has another layout of KV heads and head size.
DUMMY_SHAPES = (
    ("Qwen--Qwen2.5-0.5B", 4096),
    ("Qwen--Qwen3-0.6B", 4096),
    ("meta-llama--Llama-3.2-1B", 8192),
)
DUMMY_KV_SPACE_GIB = 1
# vLLM's offline engine with dummy weights and no tokenizer: what it logs about its KV cache goes to stderr.
# (The guard: vLLM starts its engine core with multiprocessing's spawn, which imports this file again.)
DUMMY_START = """
import sys
from vllm import LLM
if __name__ == "__main__":
    LLM(model=sys.argv[1], load_format="dummy", skip_tokenizer_init=True, max_model_len=int(sys.argv[2]),
        enforce_eager=True, dtype="bfloat16")
"""


def logged(text: str) -> tuple[int, int, float]:
    """(KV tokens, max_model_len, concurrency) of the last start in a vLLM log, read as the role reads it."""
    seen = logged_kv_cache(text)
    assert seen is not None, f"no KV-cache lines in the log:\n{text[-3000:]}"
    return seen


def within(predicted: float, reported: float) -> bool:
    return abs(predicted - reported) <= TOLERANCE * reported


def test_the_plan_predicts_the_kv_cache_each_lab_instance_logs(lab_inventory: Path, ansible: AnsibleRunner) -> None:
    plan = subprocess.run(
        [str(BIN / "gpufleet"), "plan", "-i", str(lab_inventory), "--json"],
        capture_output=True,
        text=True,
        check=False,
        cwd=PROJECT_ROOT,
        timeout=300,
    )
    assert plan.returncode == 0, plan.stdout[-3000:] + plan.stderr[-2000:]
    document = json.loads(plan.stdout)
    predicted = {
        (host, verdict["instance"]): verdict
        for group in document["capacity"]
        for host in group["hosts"]
        for verdict in group["instances"]
    }
    assert predicted and all(verdict["status"] == "fits" for verdict in predicted.values()), predicted
    journals = ansible(
        "gpu_nodes",
        "ansible.builtin.shell",
        "for unit in $(systemctl list-units 'vllm@*' --no-legend --plain | cut -d' ' -f1); do "
        'echo "=== $unit"; journalctl -u "$unit" -o cat --no-pager | grep -E \'KV cache size|Maximum concurrency\'; done',
    )
    compared = 0
    for host, result in journals.items():
        for block in result["stdout"].split("=== ")[1:]:
            unit, _, text = block.partition("\n")
            instance = unit.removeprefix("vllm@").removesuffix(".service")
            figures = predicted[(host, instance)]["figures"]
            tokens, length, concurrency = logged(text)
            assert length == figures["max_model_len"], (host, instance, length, figures)
            assert within(figures["kv_cache_tokens"], tokens), (host, instance, tokens, figures)
            assert within(figures["max_concurrency"], concurrency), (host, instance, concurrency, figures)
            compared += 1
    assert compared == len(predicted), (compared, sorted(predicted))


@pytest.mark.slow
@pytest.mark.parametrize(("fixture", "max_model_len"), DUMMY_SHAPES)
def test_vllm_reports_the_kv_cache_the_planner_predicts_for_a_real_shape(
    lab_hosts: dict[str, dict], ansible: AnsibleRunner, fixture: str, max_model_len: int
) -> None:
    host = sorted(lab_hosts)[0]
    config = json.loads((CONFIGS / fixture / "config.json").read_text())
    remote = f"/tmp/gpufleet-capacity/{fixture}"
    ansible(host, "ansible.builtin.file", f"path={remote} state=directory mode=0755")
    ansible(
        host, "ansible.builtin.copy", f"src={CONFIGS / fixture / 'config.json'} dest={remote}/config.json mode=0644"
    )
    ansible(
        host,
        "ansible.builtin.copy",
        f"content={json.dumps(DUMMY_START)} dest=/tmp/gpufleet-capacity/start.py mode=0644",
    )
    result = ansible(
        host,
        "ansible.builtin.shell",
        f"VLLM_CPU_KVCACHE_SPACE={DUMMY_KV_SPACE_GIB} VLLM_CPU_OMP_THREADS_BIND=0-1 "
        f"/opt/gpufleet/venvs/current/bin/python /tmp/gpufleet-capacity/start.py {remote} {max_model_len} 2>&1",
        timeout=900,
    )[host]
    tokens, length, concurrency = logged(result["stdout"])
    shape = shape_from_config(config)
    kv = predict_fixed_space(shape, DUMMY_KV_SPACE_GIB * GiB, max_model_len=max_model_len)
    print(f"{fixture}: predicted {kv.tokens:,} tokens {kv.max_concurrency:.2f}x, vLLM {tokens:,} {concurrency:.2f}x")
    assert length == max_model_len
    assert within(kv.tokens, tokens), (fixture, kv.tokens, tokens)
    assert within(kv.max_concurrency, concurrency), (fixture, kv.max_concurrency, concurrency)


HEADER_TOTAL = (
    "import json,struct,sys; f=open(sys.argv[1],'rb'); n=struct.unpack('<Q',f.read(8))[0]; "
    "h=json.loads(f.read(n)); h.pop('__metadata__',None); "
    "print(json.dumps({'total': sum(t['data_offsets'][1]-t['data_offsets'][0] for t in h.values())}))"
)


def test_the_lab_model_shape_is_the_model_each_lab_host_staged(ansible: AnsibleRunner) -> None:
    """The shape plan sizes the lab's model from (model_store_models[].shape) is the model each node staged: its
    config.json (model_store refuses another) and the bytes of its weights, read from the staged file's header."""
    shape_dir = PROJECT_ROOT / "lab" / "models" / "tiny-qwen2"
    shape = read_model_dir(str(shape_dir))
    assert shape.weights is not None
    configs = ansible("gpu_nodes", "ansible.builtin.slurp", "src=/var/lib/gpufleet/models/tiny-qwen2/config.json")
    headers = ansible(
        "gpu_nodes",
        "ansible.builtin.command",
        f"python3 -c {json.dumps(HEADER_TOTAL)} /var/lib/gpufleet/models/tiny-qwen2/model.safetensors",
    )
    for host, result in configs.items():
        staged = json.loads(base64.b64decode(result["content"]))
        assert staged == json.loads((shape_dir / "config.json").read_text()), host
        assert json.loads(headers[host]["stdout"])["total"] == shape.weights.total_bytes, host
