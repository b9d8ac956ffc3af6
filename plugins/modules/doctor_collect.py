#!/usr/bin/python
"""Ansible module doctor_collect: what `gpufleet doctor` reads on a node besides NVML and torch (read-only)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: doctor_collect
short_description: Read the evidence gpufleet doctor matches against its signature table
description:
  - Runs C(nvidia-smi) and reads the loaded kernel module's version, C(dkms status), every C(vllm@) instance
    (systemd state, the journal of its latest run or, in a crash loop, of its runs this boot, the model directory
    its unit serves, whether vLLM accepts the key the inference proxy sends it), and free disk space.
  - Keys are never returned; only whether the proxy's key for an instance is the one vLLM requires, and vLLM's
    HTTP answer to it.
  - Read-only; never reports a change.
version_added: "0.1.0"
author:
  - gpufleet engineers (!UNKNOWN)
options:
  journal_lines:
    description: How many lines of each instance's journal (this boot) to return.
    type: int
    default: 200
  config_dir:
    description: Where vllm_service writes each instance's environment file (C(NAME.env)).
    type: path
    default: /etc/vllm
  proxy_config:
    description: The inference proxy's nginx configuration (its C(proxy_set_header Authorization) lines).
    type: path
    default: /etc/nginx/conf.d/gpufleet-inference.conf
  disk_paths:
    description: Paths whose file system's free space is reported.
    type: list
    elements: path
    default: [/, /var/lib/gpufleet, /opt/gpufleet]
extends_documentation_fragment:
  - gpufleet.fleet.attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Read what the doctor needs
  gpufleet.fleet.doctor_collect:
"""

RETURN = r"""
nvidia_smi:
  description: C(rc) and C(output) of C(nvidia-smi), or C(rc=null) where it is not installed.
  type: dict
  returned: always
kernel_module_version:
  description: Version of the loaded nvidia kernel module (C(/sys/module/nvidia/version)), or null.
  type: str
  returned: always
dkms:
  description: C(rc) and C(output) of C(dkms status), or C(rc=null) where DKMS is not installed.
  type: dict
  returned: always
instances:
  description: One per vllm@ unit systemd knows; name, active, port, model, model_exists, journal (lines),
    proxy_key (null without a proxy, else matches and http_status).
  type: list
  elements: dict
  returned: always
disk:
  description: path, free_mib, total_mib per existing path of O(disk_paths).
  type: list
  elements: dict
  returned: always
"""

import hashlib
import os
import re
import shlex
import urllib.error
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import ConnectionError as UrlsConnectionError
from ansible.module_utils.urls import open_url

C_LOCALE = {"LANGUAGE": "C", "LC_ALL": "C"}
MIB = 1024 * 1024


def run(module: AnsibleModule, *argv: str) -> dict[str, Any]:
    binary = module.get_bin_path(argv[0])
    if not binary:
        return {"rc": None, "output": "%s is not installed" % argv[0]}
    rc, out, err = module.run_command([binary, *argv[1:]], environ_update=C_LOCALE)
    return {"rc": rc, "output": (out + err).strip()}


def read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as stream:
            return stream.read()
    except OSError:
        return None


def instance_names(module: AnsibleModule) -> list[str]:
    listed = run(module, "systemctl", "list-units", "--all", "--plain", "--no-legend", "vllm@*.service")
    return sorted({m.group(1) for m in re.finditer(r"^vllm@(\S+)\.service", listed["output"], re.MULTILINE)})


def exec_start(module: AnsibleModule, name: str) -> list[str]:
    shown = run(module, "systemctl", "show", "-p", "ExecStart", "--value", "vllm@%s.service" % name)
    match = re.search(r"argv\[\]=(.*?) ;", shown["output"])
    return shlex.split(match.group(1)) if match else []


def journal_match(module: AnsibleModule, name: str) -> list[str]:
    """The instance's latest run only: what an earlier, since repaired start printed is no evidence now. A unit
    systemd restarted on its own (NRestarts, reset by a stop and a start) is in a crash loop, whose latest run may
    have just begun and printed nothing yet: its runs of this boot are read instead."""
    shown = run(module, "systemctl", "show", "-p", "InvocationID", "-p", "NRestarts", "vllm@%s.service" % name)
    props = dict(line.partition("=")[::2] for line in shown["output"].splitlines())
    invocation = props.get("InvocationID", "").strip()
    if shown["rc"] != 0 or not invocation or props.get("NRestarts", "0").strip() not in ("", "0"):
        return ["-u", "vllm@%s.service" % name]
    return ["_SYSTEMD_INVOCATION_ID=" + invocation]


def option(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv and argv.index(flag) + 1 < len(argv) else None


def env_key(config_dir: str, name: str) -> str | None:
    text = read_text(os.path.join(config_dir, name + ".env")) or ""
    match = re.search(r'^VLLM_API_KEY="(.*)"$', text, re.MULTILINE)
    return match.group(1).replace('\\"', '"').replace("\\\\", "\\") if match else None


def proxy_keys(proxy_config: str) -> list[str] | None:
    text = read_text(proxy_config)
    if text is None:
        return None
    return sorted(set(re.findall(r'proxy_set_header Authorization "Bearer ([^"]*)";', text)))


def loopback_port(argv: list[str]) -> str | None:
    """The instance's --port, when it is only digits: the key is never sent anywhere but to loopback."""
    port = option(argv, "--port")
    return port if port and port.isdigit() else None


def http_status(port: str, key: str) -> str:
    """vLLM's answer to GET /v1/models with the proxy's key, on loopback where it listens."""
    try:
        with open_url(
            "http://127.0.0.1:%s/v1/models" % port,
            headers={"Authorization": "Bearer " + key},
            timeout=5,
            use_netrc=False,
        ) as response:
            return str(response.status)
    except urllib.error.HTTPError as error:
        return "%d %s" % (error.code, error.reason)
    except (urllib.error.URLError, OSError, UrlsConnectionError) as error:
        return "no answer (%s)" % getattr(error, "reason", error)


def fingerprint(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def instance(module: AnsibleModule, name: str, keys: list[str] | None) -> dict[str, Any]:
    params = module.params
    argv = exec_start(module, name)
    model, port = option(argv, "--model"), option(argv, "--port")
    active = run(module, "systemctl", "is-active", "vllm@%s.service" % name)["output"]
    journal = run(
        module,
        "journalctl",
        "-b",
        "0",
        *journal_match(module, name),
        "-n",
        str(params["journal_lines"]),
        "-o",
        "cat",
        "--no-pager",
        "-q",
    )["output"].splitlines()
    result = {
        "name": name,
        "active": active,
        "port": port,
        "model": model,
        "model_exists": bool(model) and os.path.isdir(model) if model and model.startswith("/") else None,
        "journal": journal,
        "proxy_key": None,
    }
    required = env_key(params["config_dir"], name)
    probe_port = loopback_port(argv)
    if keys is not None and required is not None and probe_port:
        matching = [key for key in keys if key == required]
        # The proxy sends one of its keys to this instance: a probe with each that is not vLLM's shows the 401.
        others = [key for key in keys if key != required]
        probe = matching[0] if matching else (others[0] if others else "")
        result["proxy_key"] = {
            "matches": bool(matching),
            "proxy_key_ids": [fingerprint(key) for key in keys],
            "vllm_key_id": fingerprint(required),
            "http_status": http_status(probe_port, probe),
        }
    return result


def disk(paths: list[str]) -> list[dict[str, Any]]:
    found = []
    for path in paths:
        if os.path.exists(path):
            stats = os.statvfs(path)
            found.append(
                {
                    "path": path,
                    "free_mib": stats.f_bavail * stats.f_frsize // MIB,
                    "total_mib": stats.f_blocks * stats.f_frsize // MIB,
                }
            )
    return found


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "journal_lines": {"type": "int", "default": 200},
            "config_dir": {"type": "path", "default": "/etc/vllm"},
            "proxy_config": {"type": "path", "default": "/etc/nginx/conf.d/gpufleet-inference.conf"},
            "disk_paths": {"type": "list", "elements": "path", "default": ["/", "/var/lib/gpufleet", "/opt/gpufleet"]},
        },
        supports_check_mode=True,
    )
    keys = proxy_keys(module.params["proxy_config"])
    module_version = read_text("/sys/module/nvidia/version")
    module.exit_json(
        changed=False,
        nvidia_smi=run(module, "nvidia-smi"),
        kernel_module_version=module_version.strip() if module_version else None,
        dkms=run(module, "dkms", "status"),
        instances=[instance(module, name, keys) for name in instance_names(module)],
        disk=disk(module.params["disk_paths"]),
    )


if __name__ == "__main__":
    main()
