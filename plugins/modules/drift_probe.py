#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module drift_probe: one layer's declared state against the host's, in one round trip, read-only."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: drift_probe
short_description: Compare one provisioning layer's declared state with the host's, without changing it
description:
  - Runs every check of one layer (a list of O(checks), each with a C(kind)) in one call and returns the layer's
    drift, the values that differ from the declared ones with the expected and the actual value each.
  - Used by C(playbooks/drift.yml), where each role's C(tasks/drift.yml) builds the checks from what the role
    declares it manages (its C(vars/main.yml), the same variables its tasks read) and renders its own templates
    on the controller for file contents.
  - Kinds of the system are C(file), C(directory), C(link), C(absent), C(packages), C(held), C(user), C(service),
    C(sysctl), C(http). Kinds of the stack reuse the logic of the module that provisions the layer - C(driver) and
    C(dkms) (nvidia_runfile), C(fabric_manager) (nvidia_fabric_manager), C(gpus) (nvidia_gpu_info expectations),
    C(toolkits) and C(ld_cache) (nvidia_runfile, cuda_toolkit), C(pythons) (pyenv_install), C(venv) (pip_lock),
    C(kernels) (kernel_build_key), C(models) (model_store), C(gpu_faults) (gpu_health, XIDs and DCGM's verdict).
    C(foreign) reports configuration the layer did not write that changes its component (drift_foreign).
    C(compile_cache) notes which compile caches each vLLM instance uses (vllm_compile_cache's key).
  - Read-only; never reports a change. Drift is a result, not a failure; the module fails only on checks it
    cannot understand (a bug in the playbook).
version_added: "0.1.0"
author:
  - gpufleet engineers (!UNKNOWN)
options:
  layer:
    description: Name of the layer the checks belong to (for the report), e.g. C(toolkit).
    type: str
    required: true
  checks:
    description:
      - The checks, each a dict with C(kind) and that kind's keys. C(applies=false) drops a check (for checks
        that depend on an inventory switch).
      - "C(file): C(path) and optionally C(content) (the declared text), C(sha256), C(owner), C(group), C(mode),
        C(show_diff) (default true; false for secrets)."
      - "C(directory): C(path), optional C(owner), C(group), C(mode). C(link): C(path), C(target). C(absent): C(path)."
      - "C(packages): C(names) (Debian packages installed), optional C(held). C(held): C(pattern) (installed
        packages matching it are held). C(user): C(name), optional C(group), C(home), C(shell)."
      - "C(service): C(name), optional C(enabled) (as C(systemctl is-enabled) resolves it, read as ansible's
        systemd_service reads it), C(active) (bools), C(dropins) (the drop-in paths systemd must load for the
        unit, and no other); a unit changed on disk but not reloaded is drift."
      - "C(sysctl): C(settings) (key -> value), compared with the values in effect under /proc/sys (noted, not
        compared, where /proc/sys is read-only)."
      - "C(http): C(url), optional C(status) (default 200), C(headers), C(timeout), C(validate_certs)."
      - "C(driver): C(version), optional C(library). C(gpus): C(expect) (nvidia_gpu_info's keys), optional
        C(library). C(dkms): C(module), C(version), optional C(boot_dir) (default /boot; DKMS must have installed
        the module for every kernel found there). C(fabric_manager): C(version) (the driver's), optional C(library),
        C(nvswitch_devices); on an NVSwitch system only, nv-fabricmanager of that version, its service enabled and
        active."
      - "C(toolkits): C(toolkits), a list of C({version, prefix}). C(ld_cache): C(directory)."
      - "C(pythons): C(pyenv_root), C(versions) (pyenv_python_versions), optional C(enable_shared),
        C(optimizations), C(lto), C(configure_opts)."
      - "C(venv): C(path), C(lock) (the lock's text), optional C(remove), C(allow_extra), C(python); every file
        pip installed is compared with its distribution's RECORD (size, and sha256 when it changed after the
        install)."
      - "C(kernels): C(venv), C(packages) (flash_attn_packages), optional C(arch_list), C(cuda_home), C(library)."
      - "C(models): C(root), C(models) (model_store_models), optional C(archive_cache) (the node's artifact cache)."
      - "C(foreign): configuration the layer did not write that changes its C(component): C(files) (each C(glob),
        C(match) (a regex over significant lines), C(effect), optional C(module_parameters)), C(cmdline) (C(match)
        over /proc/cmdline's parameters), C(environment) (C(match) over the names of C(systemctl show-environment)),
        C(loader) (C(libraries) the loader's cache must resolve under C(prefixes)), C(holds) (C(match) over
        C(apt-mark showhold)); C(own) lists the paths the layer writes there. Each finding names the file or
        setting, the line and the effect."
      - "C(gpu_faults): XIDs of this boot and DCGM's verdict, as the GPU health gate reads them: optional
        C(kernel_log) (C(journal), the default, or a file), C(xid_ignore) (XIDs not reported), C(dcgm_level)
        (C(dcgmi diag -r) level where DCGM is installed; 0, the default, runs none)."
    type: list
    elements: dict
    required: true
extends_documentation_fragment:
  - gpufleet.fleet.attributes
attributes:
  check_mode:
    support: full
    details: The module only reads; check mode runs it the same way.
  diff_mode:
    support: none
  platform:
    platforms: posix
notes:
  - The C(gpufleet_drift) return value is what the C(gpufleet_drift) callback plugin collects into the fleet report.
seealso:
  - module: gpufleet.fleet.nvidia_gpu_info
  - module: gpufleet.fleet.pip_lock
"""

EXAMPLES = r"""
- name: Compare the toolkit layer
  gpufleet.fleet.drift_probe:
    layer: toolkit
    checks:
      - kind: toolkits
        toolkits:
          - {version: "13.0.2", prefix: /usr/local/cuda-13.0}
      - kind: link
        path: /usr/local/cuda
        target: /usr/local/cuda-13.0
      - kind: file
        path: /etc/ld.so.conf.d/cuda.conf
        content: "{{ lookup('ansible.builtin.template', 'roles/cuda_toolkit/templates/etc/ld.so.conf.d/cuda.conf.j2') }}"
        owner: root
        mode: "0644"
  register: toolkit_drift

- name: Fail a CI job on GPU health drift
  gpufleet.fleet.drift_probe:
    layer: gpu_health
    checks:
      - kind: gpus
        expect: {ecc_errors: 0, persistence: true, row_remap_pending: false}
  register: health
  failed_when: health.gpufleet_drift.status != 'ok'
"""

RETURN = r"""
ansible_facts:
  description: C(gpufleet_drift_last), the same result as C(gpufleet_drift), for plays that include a role's drift
    entry point and cannot register its task.
  returned: success
  type: dict
gpufleet_drift:
  description: The layer's result, as the fleet report stores it.
  returned: success
  type: dict
  contains:
    layer:
      description: The layer.
      type: str
      sample: toolkit
    status:
      description: C(ok), C(drifted) (some value differs) or C(error) (some state could not be read and nothing differs).
      type: str
      sample: drifted
    drift:
      description: One entry per differing value.
      type: list
      elements: dict
      contains:
        check:
          description: What was checked.
          type: str
          sample: link /usr/local/cuda
        field:
          description: Which of its values differs.
          type: str
          sample: target
        expected:
          description: The declared value.
          type: raw
          sample: /usr/local/cuda-13.0
        actual:
          description: The host's value.
          type: raw
          sample: /usr/local/cuda-12.8
        detail:
          description: More about the difference (a unified diff of a file, the reason); may be empty.
          type: str
          sample: ""
    errors:
      description: Checks that could not read the state, C(check) (kind) and C(message).
      type: list
      elements: dict
    checked:
      description: How many checks ran.
      type: int
      sample: 4
    notes:
      description: What could not be compared and why, without being drift.
      type: list
      elements: str
"""

import traceback

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.fleet.plugins.module_utils.drift_checks import (
    Context,
    SpecError,
    register,
    run_checks,
    validate,
)
from ansible_collections.gpufleet.fleet.plugins.module_utils.compile_cache import KINDS as COMPILE_CACHE_KINDS
from ansible_collections.gpufleet.fleet.plugins.module_utils.drift_foreign import KINDS as FOREIGN_KINDS
from ansible_collections.gpufleet.fleet.plugins.module_utils.drift_gpu_faults import KINDS as GPU_FAULT_KINDS
from ansible_collections.gpufleet.fleet.plugins.module_utils.drift_stack import KINDS as STACK_KINDS
from ansible_collections.gpufleet.fleet.plugins.module_utils.ray_cluster import KINDS as RAY_KINDS


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            layer=dict(type="str", required=True),
            checks=dict(type="list", elements="dict", required=True),
        ),
        supports_check_mode=True,
    )
    register(STACK_KINDS)
    register(FOREIGN_KINDS)
    register(GPU_FAULT_KINDS)
    register(RAY_KINDS)
    register(COMPILE_CACHE_KINDS)
    try:
        checks = validate(module.params["checks"])
    except SpecError as error:
        module.fail_json(msg=f"layer {module.params['layer']}: {error}", changed=False)

    def run(argv: list) -> tuple:
        """A read-only command; a missing executable is rc 127 (the check reports it), not a dead module."""
        try:
            return module.run_command(
                [str(part) for part in argv], environ_update={"LC_ALL": "C", "LANGUAGE": "C"}, handle_exceptions=False
            )
        except OSError as error:
            return 127, "", str(error)

    try:
        result = run_checks(checks, Context(run=run))
    except SpecError as error:
        module.fail_json(msg=f"layer {module.params['layer']}: {error}", changed=False)
    except Exception as error:  # noqa: BLE001 - a bug must become an error of this layer, not a dead run
        module.fail_json(
            msg=f"layer {module.params['layer']}: {type(error).__name__}: {error}",
            exception=traceback.format_exc(),
            changed=False,
        )
    result["layer"] = module.params["layer"]
    # Also a fact, so that a play that includes a role's drift entry point (the upgrade's check of a node after
    # its layers) reads the layer's result without registering inside the role.
    module.exit_json(changed=False, gpufleet_drift=result, ansible_facts={"gpufleet_drift_last": result})


if __name__ == "__main__":
    main()
