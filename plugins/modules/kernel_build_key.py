#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Compute the build key of a kernel package for a venv, and whether the venv already holds that build."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kernel_build_key
short_description: The build key of a compiled kernel package (flash-attn) for a venv, and its install state
description:
  - Runs a probe with the venv's interpreter (Python version, torch version, C(torch.version.cuda), the
    C++ ABI torch was built with) and, for a package that compiles CUDA code, C(CUDA_HOME/bin/nvcc --version).
  - "The key is a digest of what the wheel depends on: package, version and source sha256, Python, machine,
    torch and its CUDA, the ABI, nvcc's version, the normalized C(TORCH_CUDA_ARCH_LIST) and the build
    environment. Nodes with the same key can share one wheel; any change means a rebuild."
  - Reports the key the venv's installed build was made with (from the marker the flash_attn role writes
    in C(VENV/gpufleet-kernels/NAME.json)) and the installed version, so the role installs only when they differ.
  - Fails with a clear message when torch is not importable in the venv (the build runs without isolation
    and needs it), or, for a CUDA package, when nvcc is missing, torch is a CPU build, or the arch list is empty.
  - Read-only; never reports a change.
version_added: "0.1.0"
author:
  - gpufleet engineers (!UNKNOWN)
options:
  venv:
    description: The venv the kernel is built against and installed into.
    type: path
    required: true
  package:
    description:
      - The package, with keys C(name), C(version), C(sha256) (of its source) and C(requires_cuda)
        (default true); C(env), a dict of build environment variables, is part of the key.
    type: dict
    required: true
  arch_list:
    description: The CUDA architectures to compile for (TORCH_CUDA_ARCH_LIST), e.g. C(8.0;9.0). Ignored without CUDA.
    type: str
    default: ""
  cuda_home:
    description: The CUDA toolkit (C(CUDA_HOME)); its C(bin/nvcc) compiles the kernel.
    type: path
    default: /usr/local/cuda
extends_documentation_fragment:
  - gpufleet.fleet.attributes
attributes:
  check_mode:
    support: full
    details: The module only reads; it runs the same way in check mode.
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Key flash-attn for the current venv and the fleet's GPUs
  gpufleet.fleet.kernel_build_key:
    venv: /opt/gpufleet/venvs/current
    package: {name: flash-attn, version: "2.8.3", sha256: "<sha256 of the sdist>", env: {FLASH_ATTENTION_FORCE_BUILD: "TRUE"}}
    arch_list: "8.0;9.0"
    cuda_home: /usr/local/cuda-12.8
  register: flash_attn_key
"""

RETURN = r"""
key:
  description: The build key (16 hex digits).
  returned: always
  type: str
  sample: 3f09c2d4a1b7e655
components:
  description: What the key is made of.
  returned: always
  type: dict
installed_key:
  description: The key of the build installed in the venv, from its marker; empty when none.
  returned: always
  type: str
installed_version:
  description: The package's version installed in the venv; empty when it is not installed.
  returned: always
  type: str
up_to_date:
  description: Whether the venv holds this very build (same key, package installed at the version).
  returned: always
  type: bool
nvcc:
  description: nvcc's version, or null when the package needs no CUDA or nvcc is absent.
  returned: always
  type: str
warnings_list:
  description: Doubts that do not stop the build (nvcc and torch's CUDA of different releases).
  returned: always
  type: list
  elements: str
marker:
  description: The marker of the build installed in the venv (its key, wheel, origin, torch probe); empty when none.
  returned: always
  type: dict
probe:
  description: What the venv's interpreter said of itself and its torch (Python, machine, torch, its CUDA, C++ ABI).
  returned: always
  type: dict
torch_identity:
  description:
    - A digest of torch's RECORD, the venv's pyvenv.cfg and its interpreter binary, or null without a torch RECORD.
    - The marker keeps it with the probe, so drift reuses the probe while the identity holds instead of importing torch.
  returned: always
  type: str
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.fleet.plugins.module_utils.kernel_key import (
    TORCH_PROBE,
    KernelKeyError,
    build_key,
    check_cuda_build,
    key_components,
    parse_nvcc_version,
    torch_identity,
)

VERSION_PROBE = (
    "import importlib.metadata as m, sys\n"
    "try:\n"
    "    print(m.version(sys.argv[1]))\n"
    "except m.PackageNotFoundError:\n"
    "    print('')\n"
)


def marker_path(venv: str, name: str) -> str:
    return os.path.join(venv, "gpufleet-kernels", f"{name}.json")


def run_probe(module: AnsibleModule, python: str) -> dict:
    rc, out, err = module.run_command([python, "-I", "-c", TORCH_PROBE], environ_update={"LC_ALL": "C"})
    if rc != 0:
        module.fail_json(msg=f"the venv's interpreter {python} cannot run: {(err or out).strip()[-300:]}")
    return json.loads(out.strip().splitlines()[-1])


def nvcc_version(module: AnsibleModule, cuda_home: str) -> str | None:
    nvcc = os.path.join(cuda_home, "bin", "nvcc")
    if not os.access(nvcc, os.X_OK):
        return None
    rc, out, err = module.run_command([nvcc, "--version"], environ_update={"LC_ALL": "C"})
    if rc != 0:
        module.fail_json(msg=f"{nvcc} --version failed: {(err or out).strip()[-300:]}")
    return parse_nvcc_version(out)


def installed_state(module: AnsibleModule, python: str, venv: str, name: str) -> tuple[dict, str]:
    """The marker of the installed build ({} when none) and the package's installed version."""
    rc, out, dummy = module.run_command([python, "-I", "-c", VERSION_PROBE, name], environ_update={"LC_ALL": "C"})
    version = out.strip() if rc == 0 else ""
    try:
        with open(marker_path(venv, name), encoding="utf-8") as handle:
            marker = json.load(handle)
    except (OSError, ValueError):
        marker = {}
    return (marker if isinstance(marker, dict) else {}), version


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            venv=dict(type="path", required=True),
            package=dict(type="dict", required=True),
            arch_list=dict(type="str", default=""),
            cuda_home=dict(type="path", default="/usr/local/cuda"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    package = p["package"]
    missing = [key for key in ("name", "version", "sha256") if not package.get(key)]
    if missing:
        module.fail_json(msg=f"package {package} lacks {', '.join(missing)}")
    python = os.path.join(p["venv"], "bin", "python")
    if not os.path.exists(python):
        module.fail_json(msg=f"{p['venv']} is not a venv (no bin/python): install the venv first (tag venv)")
    probe = run_probe(module, python)
    try:
        requires_cuda = bool(package.get("requires_cuda", True))
        nvcc = nvcc_version(module, p["cuda_home"]) if requires_cuda else None
        warnings = check_cuda_build(package, probe, nvcc, p["cuda_home"], p["arch_list"]) if requires_cuda else []
        components = key_components(package, probe, nvcc, p["arch_list"], package.get("env") or {})
    except KernelKeyError as error:
        module.fail_json(msg=str(error), probe=probe)
    key = build_key(components)
    marker, installed_version = installed_state(module, python, p["venv"], package["name"])
    installed_key = str(marker.get("key", ""))
    for warning in warnings:
        module.warn(warning)
    module.exit_json(
        changed=False,
        key=key,
        components=components,
        installed_key=installed_key,
        installed_version=installed_version,
        nvcc=nvcc,
        warnings_list=warnings,
        probe=probe,
        torch_identity=torch_identity(p["venv"]),
        marker=marker,
        up_to_date=installed_key == key and installed_version == str(package["version"]),
    )


if __name__ == "__main__":
    main()
