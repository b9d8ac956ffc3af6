"""State serving leaves on every lab host, read from the host itself (and through its proxy)."""

from __future__ import annotations

import json
import os
import re
import ssl
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

PROJECT = Path(os.environ.get("MOLECULE_PROJECT_DIRECTORY") or Path(__file__).resolve().parents[3])
LAB_VARS = PROJECT / "inventories" / "lab" / "group_vars" / "all"
CACHE = Path(os.environ.get("GPUFLEET_CACHE") or "/var/cache/gpufleet")
INSTANCES = yaml.safe_load((LAB_VARS / "serve.yml").read_text())["vllm_service_instances"]
MODELS = yaml.safe_load((LAB_VARS / "model.yml").read_text())["model_store_models"]
MAX_EXPOSURE = 3.0


def _main_pid(host, name: str) -> int:
    return int(host.run(f"systemctl show -p MainPID --value vllm@{name}.service").stdout.strip())


def _properties(host, name: str) -> dict[str, str]:
    # --all: also the properties that are empty, such as an emptied CapabilityBoundingSet.
    output = host.run(f"systemctl show --all vllm@{name}.service").stdout
    return dict(line.split("=", 1) for line in output.splitlines() if "=" in line)


@pytest.mark.parametrize("instance", INSTANCES, ids=lambda i: i["name"])
def test_instance_runs_enabled_as_a_user_of_its_own(host, instance: dict) -> None:
    service = host.service(f"vllm@{instance['name']}")
    assert service.is_running and service.is_enabled
    pid = _main_pid(host, instance["name"])
    # systemd's dynamic user (the lab resolves no name for it: nss-systemd is not configured), with group vllm.
    uid, groups = (
        host.run(f"awk '/^{key}:/ {{print $2, $3}}' /proc/{pid}/status").stdout.split() for key in ("Uid", "Groups")
    )
    assert uid[0] != str(host.user("vllm").uid) and str(host.group("vllm").gid) in groups


@pytest.mark.parametrize("instance", INSTANCES, ids=lambda i: i["name"])
def test_instance_listens_on_loopback_only(host, instance: dict) -> None:
    assert host.socket(f"tcp://127.0.0.1:{instance['port']}").is_listening
    assert not host.socket(f"tcp://0.0.0.0:{instance['port']}").is_listening


@pytest.mark.parametrize("instance", INSTANCES, ids=lambda i: i["name"])
def test_unit_is_hardened_and_restarts(host, instance: dict) -> None:
    properties = _properties(host, instance["name"])
    expected = {
        "User": f"vllm-{instance['name']}",
        "DynamicUser": "yes",
        "CacheDirectory": f"vllm/{instance['name']}",
        "Restart": "always",
        "RestartUSec": "10s",
        "TimeoutStartUSec": "30min",
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "ProtectKernelTunables": "yes",
        "ProtectKernelModules": "yes",
        "ProtectControlGroups": "yes",
        "RestrictNamespaces": "yes",
        "DevicePolicy": "closed",
        "CapabilityBoundingSet": "",
        "UMask": "0077",
        "LimitNOFILE": "1048576",
        # SIGINT to vLLM's main process only (a starting vLLM loses SIGTERM), what is left killed at once.
        "KillSignal": "2",
        "KillMode": "mixed",
    }
    assert {key: properties.get(key) for key in expected} == expected


@pytest.mark.parametrize("instance", INSTANCES, ids=lambda i: i["name"])
def test_security_exposure_is_at_most_3(host, instance: dict) -> None:
    output = host.run(f"systemd-analyze security vllm@{instance['name']}.service").stdout
    found = re.search(r"Overall exposure level for \S+: ([0-9.]+)", output)
    assert found, output[-2000:]
    print(f"{host.backend.hostname} vllm@{instance['name']}: exposure {found.group(1)}")
    assert float(found.group(1)) <= MAX_EXPOSURE


@pytest.mark.parametrize("instance", INSTANCES, ids=lambda i: i["name"])
def test_process_runs_the_declared_options_without_the_key(host, instance: dict) -> None:
    pid = _main_pid(host, instance["name"])
    argv = host.run(f"tr '\\0' '\\n' < /proc/{pid}/cmdline").stdout.splitlines()
    options = dict(zip(argv, argv[1:]))
    assert options["--served-model-name"] == instance["served_model_name"]
    assert options["--port"] == str(instance["port"]) and options["--host"] == "127.0.0.1"
    assert options["--model"] == instance["model"] and options["--max-model-len"] == "512"
    assert "--enforce-eager" in argv and not any("API_KEY" in a or "api-key" in a for a in argv)
    environment = host.run(f"tr '\\0' '\\n' < /proc/{pid}/environ").stdout.splitlines()
    assert f"CUDA_VISIBLE_DEVICES={','.join(map(str, instance['gpus']))}" in environment
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in environment
    assert any(line.startswith("VLLM_API_KEY=") and len(line) > 30 for line in environment)


@pytest.mark.parametrize("instance", INSTANCES, ids=lambda i: i["name"])
def test_environment_file_is_root_only(host, instance: dict) -> None:
    env_file = host.file(f"/etc/vllm/{instance['name']}.env")
    assert env_file.user == "root" and env_file.mode == 0o600
    assert host.file("/etc/vllm").mode == 0o700


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m["name"])
def test_model_is_staged_verified_and_read_only_for_the_service(host, model: dict) -> None:
    link = host.file(f"/var/lib/gpufleet/models/{model['name']}")
    assert link.is_symlink and link.linked_to.endswith(f"{model['name']}-{model['sha256'][:16]}")
    marker = json.loads(host.file(f"{link.linked_to}/.gpufleet-model.json").content_string)
    assert marker["sha256"] == model["sha256"]
    weights = host.file(f"{link.linked_to}/model.safetensors")
    assert weights.user == "root" and weights.group == "vllm" and weights.mode == 0o640


def test_generation_overrides_are_merged_over_the_kept_original(host) -> None:
    greedy = next(m for m in MODELS if m.get("generation_config_overrides"))
    directory = f"/var/lib/gpufleet/models/{greedy['name']}"
    merged = json.loads(host.file(f"{directory}/generation_config.json").content_string)
    original = json.loads(host.file(f"{directory}/.gpufleet-original/generation_config.json").content_string)
    assert "temperature" not in original
    assert merged == {**original, **greedy["generation_config_overrides"]}


def test_nginx_site_is_root_only_and_listens_for_api_and_metrics(host) -> None:
    site = host.file("/etc/nginx/conf.d/gpufleet-inference.conf")
    assert site.user == "root" and site.mode == 0o600
    # The certificate chain and its key in one root-only file, replaced by one rename (review L14); the two
    # files of earlier releases are gone.
    tls = host.file("/etc/nginx/tls/gpufleet-inference.pem")
    assert tls.user == "root" and tls.mode == 0o600
    assert tls.content_string.index("-----BEGIN CERTIFICATE-----") < tls.content_string.index("PRIVATE KEY-----")
    assert not host.file("/etc/nginx/tls/gpufleet-inference.crt").exists
    assert not host.file("/etc/nginx/tls/gpufleet-inference.key").exists
    assert host.service("nginx").is_running and host.service("nginx").is_enabled
    assert host.socket("tcp://0.0.0.0:443").is_listening and host.socket("tcp://0.0.0.0:9443").is_listening
    assert not host.file("/etc/nginx/sites-enabled/default").exists


def _status(url: str, key: str | None) -> int:
    context = ssl.create_default_context(cafile=str(CACHE / "lab-tls" / "ca.crt"))
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def test_proxy_requires_the_key(host) -> None:
    address = host.ansible.get_variables()["ansible_host"]
    key = (CACHE / "lab-secrets" / "proxy-api-key").read_text().strip()
    assert _status(f"https://{address}/v1/models", key) == 200
    assert _status(f"https://{address}/v1/models", None) == 401
    assert _status(f"https://{address}/health", None) == 200
