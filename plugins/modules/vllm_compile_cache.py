#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Key, pack or install the compile and JIT caches of one vLLM instance."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_compile_cache
short_description: Key, pack or install the compile and JIT caches of one vLLM instance
description:
  - "The caches vLLM and its kernels keep in the instance's home (C(~/.cache/vllm), C(torchinductor), C(triton),
    C(flashinfer)) are the same on every node with the same key: the venv's distributions and Python, the GPUs'
    names and compute capabilities (or the CPU's instruction sets), the model's C(config.json) and path, the
    instance's home (vLLM's compile-cache hash and flashinfer's ninja files hold its path), and the instance's
    options less those that only place it on its node."
  - C(state=key) computes the key and reads which cache the home holds (the marker an install writes). Read-only.
  - C(state=packed) writes the home's caches to O(archive) (tar, the key record first, owners and times zeroed)
    and returns its sha256. Run it after the instance served, on the node that built the caches.
  - "C(state=installed) verifies O(archive) (its sha256 and the key it was built for) and only then replaces the
    home's caches with it, owned like the home, every file given the install's time and ninja's logs rebased to it
    (so that flashinfer's ninja finds its JIT builds newer than this node's venv). A cache that fails either check
    is not installed: the module warns,
    naming both values, returns RV(refused), changes nothing, and the instance starts cold."
  - "C(state=key) returns an empty RV(key) and RV(reason) where nothing can be keyed (no venv yet, a model without
    C(config.json))."
version_added: "0.1.0"
author:
  - gpufleet engineers (!UNKNOWN)
options:
  state:
    description: What to do.
    type: str
    choices: [key, packed, installed]
    default: key
  venv:
    description: The venv the instance serves from.
    type: path
    required: true
  instance:
    description: The instance's declaration (vllm_service_instances entry, defaults applied); C(model) is a path.
    type: dict
    required: true
  home:
    description: The instance's home (its systemd cache directory), which holds C(.cache).
    type: path
    required: true
  archive:
    description: The archive to write (C(state=packed)) or to install (C(state=installed)).
    type: path
  sha256:
    description: The sha256 the archive was recorded with when it was packed (C(state=installed)).
    type: str
  key:
    description: The key the archive must carry (C(state=installed)); by default the key computed here.
    type: str
extends_documentation_fragment:
  - gpufleet.fleet.attributes
attributes:
  check_mode:
    support: full
    details: C(state=key) only reads; C(packed) and C(installed) report what they would do and change nothing.
  diff_mode:
    support: full
    details: C(installed) shows the key of the cache in the home before and after.
"""

EXAMPLES = r"""
- name: Key the caches of vllm@main
  gpufleet.fleet.vllm_compile_cache:
    venv: /opt/gpufleet/venvs/current
    instance: {name: main, model: /var/lib/gpufleet/models/tiny-qwen2, dtype: bfloat16, gpus: [0]}
    home: /var/cache/private/vllm/main
  register: compile_cache
"""

RETURN = r"""
key:
  description: The key of the instance's caches on this node.
  returned: always
  type: str
components:
  description: What the key digests.
  returned: always
  type: dict
installed_key:
  description: The key of the cache an install put in the home (empty when none was installed).
  returned: always
  type: str
present:
  description: The cache directories the home holds now.
  returned: always
  type: list
  elements: str
sha256:
  description: The archive's sha256 (C(state=packed)).
  returned: when state is packed
  type: str
refused:
  description: Why the archive was not installed (C(state=installed)).
  returned: when the archive failed its checks
  type: str
reason:
  description: Why nothing could be keyed (C(state=key)).
  returned: when key is empty
  type: str
size:
  description: The archive's size in bytes (C(state=packed)).
  returned: when state is packed
  type: int
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.fleet.plugins.module_utils.compile_cache import (
    CompileCacheError,
    cache_key,
    install,
    node_key_components,
    pack,
    present_directories,
    read_marker,
    verify,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", choices=["key", "packed", "installed"], default="key"),
            venv=dict(type="path", required=True),
            instance=dict(type="dict", required=True),
            home=dict(type="path", required=True),
            archive=dict(type="path"),
            sha256=dict(type="str"),
            key=dict(type="str", no_log=False),
        ),
        required_if=[("state", "packed", ("archive",)), ("state", "installed", ("archive", "sha256"))],
        supports_check_mode=True,
    )
    p = module.params

    def run(argv: list[str]) -> tuple[int, str, str]:
        try:
            # The C locale, as drift's compile_cache check reads the compilers: both key a node alike.
            return module.run_command(argv, environ_update={"LC_ALL": "C"}, handle_exceptions=False)
        except OSError as error:
            return 127, "", str(error)

    try:
        components = node_key_components(p["venv"], p["instance"], p["home"], run)
    except CompileCacheError as error:
        if p["state"] != "key":
            module.fail_json(msg=str(error))
        # Nothing to key (no venv yet in check mode, a model without config.json): the instance starts cold.
        module.exit_json(changed=False, key="", reason=str(error), installed_key="", present=[])
    key = cache_key(components)
    marker = read_marker(p["home"]) or {}
    result = dict(
        changed=False,
        key=key,
        components=components,
        installed_key=str(marker.get("key", "")),
        present=present_directories(p["home"]) if os.path.isdir(p["home"]) else [],
    )
    try:
        if p["state"] == "packed":
            result["changed"] = True
            if not module.check_mode:
                result.update(pack(p["home"], key, components, p["archive"]))
        elif p["state"] == "installed":
            wanted = p["key"] or key
            result["changed"] = result["installed_key"] != wanted
            result["diff"] = dict(
                before=f"compile cache: {result['installed_key'] or 'none'}\n", after=f"compile cache: {wanted}\n"
            )
            if result["changed"] and module.check_mode and os.path.exists(p["archive"]):
                verify(p["archive"], p["sha256"], wanted)
            elif result["changed"]:
                result["present"] = install(p["archive"], p["sha256"], wanted, p["home"])
                result["installed_key"] = wanted
    except CompileCacheError as error:
        if p["state"] == "packed":
            module.fail_json(msg=str(error), **result)
        # A cache that fails its checks is never installed; the instance compiles its own, and says why.
        module.warn(f"compile cache {p['key'] or key} not installed in {p['home']}, vLLM starts cold: {error}")
        result.update(changed=False, refused=str(error))
        result.pop("diff", None)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
