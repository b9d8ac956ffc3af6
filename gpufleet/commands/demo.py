"""`gpufleet demo`: the main job on the built-in lab — boot the lab fleet, fill its mirror, provision it, and
ask the first node for a completion through its TLS proxy."""

from __future__ import annotations

import argparse
import json
import os
import ssl
import urllib.error
import urllib.request
from pathlib import Path

import yaml

from gpufleet import PROJECT_ROOT
from gpufleet.cli import main as gpufleet_main
from gpufleet.errors import GpufleetError
from gpufleet.lab.config import load_config
from gpufleet.progress import add_verbose_flag, progress_options
from gpufleet.runner import format_summary, run_playbook

LAB_SERVE_VARS = PROJECT_ROOT / "inventories" / "lab" / "group_vars" / "all" / "serve.yml"
DEMO_PROMPT = "A GPU fleet is"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo", help="boot the lab fleet, provision it with playbooks/site.yml, and ask it for a completion"
    )
    parser.add_argument("--hosts", type=int, default=2, help="number of lab hosts (default 2)")
    add_verbose_flag(parser)
    parser.set_defaults(func=run)


def lab_cache() -> Path:
    return Path(os.environ.get("GPUFLEET_CACHE") or "/var/cache/gpufleet")


def lab_inventory() -> Path:
    """The inventory `gpufleet lab up` wrote: GPUFLEET_LAB_INVENTORY's, or the lab's default."""
    return load_config().inventory_path


def first_host_address() -> str:
    inventory = yaml.safe_load(lab_inventory().read_text())
    hosts = inventory["all"]["children"]["gpu_nodes"]["hosts"]
    return str(hosts[sorted(hosts)[0]]["ansible_host"])


def served_model_name() -> str:
    instances = yaml.safe_load(LAB_SERVE_VARS.read_text())["vllm_service_instances"]
    return str(instances[0]["served_model_name"])


def complete_through_proxy(address: str, model: str) -> dict:
    """POST /v1/completions to https://ADDRESS with the lab's API key, verified against the lab CA."""
    cache = lab_cache()
    api_key = (cache / "lab-secrets" / "proxy-api-key").read_text().strip()
    context = ssl.create_default_context(cafile=str(cache / "lab-tls" / "ca.crt"))
    body = json.dumps({"model": model, "prompt": DEMO_PROMPT, "max_tokens": 24}).encode()
    request = urllib.request.Request(
        f"https://{address}/v1/completions",
        data=body,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=120, context=context) as response:
            return json.loads(response.read())
    except (urllib.error.URLError, OSError) as error:
        raise GpufleetError(f"the completion through https://{address} failed: {error}") from error


def run(args: argparse.Namespace) -> int:
    rc = gpufleet_main(["lab", "up", "--hosts", str(args.hosts)])
    if rc != 0:
        return rc
    for playbook in ("lab_mirror.yml", "site.yml"):
        result = run_playbook(playbook, lab_inventory(), **progress_options(args.verbose))
        if result.rc != 0:
            print(format_summary(result))
            return 1
    print()
    print(format_summary(result))
    address, model = first_host_address(), served_model_name()
    answer = complete_through_proxy(address, model)
    print()
    print(f"POST https://{address}/v1/completions (model {model!r}, through nginx with TLS and the API key)")
    print(f"  prompt:     {DEMO_PROMPT!r}")
    print(f"  completion: {answer['choices'][0]['text']!r}  (random weights: the words mean nothing)")
    print(f"  usage:      {answer.get('usage')}")
    print()
    print(f"The lab is running: `gpufleet lab status` lists its hosts; inventory {lab_inventory()}.")
    print(f"CA {lab_cache() / 'lab-tls' / 'ca.crt'}, API key in {lab_cache() / 'lab-secrets' / 'proxy-api-key'}.")
    print("End it with `gpufleet lab down`.")
    return 0
